"""Which watch events ask for a reconcile (controller.triggers): a table of changes to one object."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from lorapool.api.pods import engine_pod
from lorapool.api.report import (
    ANNOTATION,
    SYNCED_CONDITION,
    AdapterReport,
    Observations,
    ReplicaReport,
    encode,
)
from lorapool.api.report import ReplicaPhase as P
from lorapool.controller.triggers import object_mark, pod_mark

ID, OLD = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"


def report(obs: Observations | None = None, **adapters: AdapterReport) -> str:
    return encode(ReplicaReport(engine_healthy=True, adapters=adapters, observations=obs))


def pod(text: str, synced_message: str = "1 loaded, 0 failed, 1 in progress of 2") -> dict[str, Any]:
    return {
        "metadata": {"name": "e-0", "labels": {"lorapool.io/pool": "p"},
                     "annotations": {ANNOTATION: text, "lorapool.io/slot": "0"}},
        "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": SYNCED_CONDITION, "status": "False", "reason": "Syncing", "message": synced_message},
        ]},
    }  # fmt: skip


BASE = pod(report(sql=AdapterReport(P.LOADED, ID, ID), chat=AdapterReport(P.DOWNLOADING, ID)))


def edit(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    fn(obj)
    return obj


def set_report(text: str) -> Callable[[dict[str, Any]], None]:
    return lambda o: o["metadata"]["annotations"].__setitem__(ANNOTATION, text)


OBS = Observations(
    window_s=60.0,
    end=1_800_000_000.0,
    samples=12,
    max_loras=4,
    distinct_p50=2.0,
    distinct_p95=3.0,
    distinct_max=3,
    slot_wait_s=0.0,
    kv_wait_s=0.0,
    kv_usage_p50=0.2,
    kv_usage_p95=0.3,
    kv_usage_max=0.4,
    running_p95=4.0,
    waiting_p95=0.0,
    preemptions=0,
)
POD_CHANGES = {
    # no reconcile: nothing the operator computes changed
    "downloading->verifying": (set_report(report(sql=AdapterReport(P.LOADED, ID, ID), chat=AdapterReport(P.VERIFYING, ID))), False),
    "synced-message-counts": (lambda o: o["status"]["conditions"][1].__setitem__("message", "1 loaded, 0 failed, 1 in progress of 2 (again)"), False),
    "observations-only": (set_report(report(OBS, sql=AdapterReport(P.LOADED, ID, ID), chat=AdapterReport(P.DOWNLOADING, ID))), False),
    # a reconcile: loadedReplicas, failures, readiness, slots, deletion
    "loading->loaded": (set_report(report(sql=AdapterReport(P.LOADED, ID, ID), chat=AdapterReport(P.LOADED, ID, ID))), True),
    "loading->failed": (set_report(report(sql=AdapterReport(P.LOADED, ID, ID), chat=AdapterReport(P.FAILED, ID, message="rank"))), True),
    "new-revision-swapping": (set_report(report(sql=AdapterReport(P.DOWNLOADING, OLD, ID), chat=AdapterReport(P.DOWNLOADING, ID))), True),
    "adapter-removed": (set_report(report(sql=AdapterReport(P.LOADED, ID, ID))), True),
    "report-unreadable": (set_report("{broken"), True),
    "not-ready": (lambda o: o["status"]["conditions"][0].__setitem__("status", "False"), True),
    "synced": (lambda o: o["status"]["conditions"][1].update(status="True", reason="Synced"), True),
    "slot-annotation": (lambda o: o["metadata"]["annotations"].__setitem__("lorapool.io/slot", "1"), True),
    "terminating": (lambda o: o["metadata"].__setitem__("deletionTimestamp", "2026-12-03T00:00:00Z"), True),
    "unschedulable": (lambda o: o["status"]["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}), True),
}  # fmt: skip


@pytest.mark.parametrize(("change", "triggers"), list(POD_CHANGES.values()), ids=list(POD_CHANGES))
def test_pod_mark(change: Callable[[dict[str, Any]], None], triggers: bool) -> None:
    assert (pod_mark(engine_pod(edit(change))) != pod_mark(engine_pod(BASE))) == triggers


META = {"generation": 3, "labels": {"a": "b"}, "annotations": {"x": "y"}}
OBJECT_CHANGES = {
    "status-only (same metadata)": ({**META}, False),
    "spec (generation)": ({**META, "generation": 4}, True),
    "label": ({**META, "labels": {"a": "c"}}, True),
    "annotation": ({**META, "annotations": {"x": "z"}}, True),
    "deletion": ({**META, "deletionTimestamp": "2026-12-03T00:00:00Z"}, True),
}


@pytest.mark.parametrize(("meta", "triggers"), list(OBJECT_CHANGES.values()), ids=list(OBJECT_CHANGES))
def test_object_mark(meta: dict[str, Any], triggers: bool) -> None:
    assert (object_mark(meta) != object_mark(META)) == triggers
