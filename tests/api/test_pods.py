"""An engine Pod read once: each fact the operator and the router read, from the Pod as listed."""

from __future__ import annotations

from typing import Any

import pytest

from lorapool.api.pods import (
    POD_DELETION_COST_ANNOTATION,
    SLOT_ANNOTATION,
    EnginePod,
    RouterPod,
    engine_pod,
    engine_pods,
    router_pods,
)
from lorapool.api.report import ANNOTATION, AdapterReport, ReplicaPhase, ReplicaReport, encode
from lorapool.api.requests import ANNOTATION as REQUESTS
from lorapool.api.requests import RequestWindow
from lorapool.api.requests import encode as encode_requests

REPORT = ReplicaReport(True, {"sql": AdapterReport(ReplicaPhase.LOADED, "a" * 16, "a" * 16)})


def pod(
    *conditions: dict[str, str], deleting: bool = False, report: str | None = None, **annotations: str
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "e-0", "resourceVersion": "7", "annotations": dict(annotations)}
    if report is not None:
        meta["annotations"][ANNOTATION] = report
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    return {"metadata": meta, "status": {"podIP": "10.0.0.1", "phase": "Running", "conditions": list(conditions)}}


READY = {"type": "Ready", "status": "True"}
UNSCHEDULED = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}

CASES = {
    "ready-with-report": (pod(READY, report=encode(REPORT)), True, False, True, False),
    "not-ready": (pod(report=encode(REPORT)), False, False, False, False),
    "terminating": (pod(READY, deleting=True, report=encode(REPORT)), True, True, False, False),
    "no-report": (pod(READY), True, False, False, False),
    "newer-format": (pod(READY, report='{"v": 99}'), True, False, False, True),
    "broken": (pod(READY, report="{not json"), True, False, False, True),
    "no-status": ({"metadata": {"name": "e-0"}}, False, False, False, False),
}


@pytest.mark.parametrize(("obj", "ready", "terminating", "usable", "unreadable"), list(CASES.values()), ids=list(CASES))
def test_engine_pod_reads_readiness_deletion_and_the_report(
    obj: dict[str, Any], ready: bool, terminating: bool, usable: bool, unreadable: bool
) -> None:
    p = engine_pod(obj)
    assert (p.name, p.ready, p.terminating, p.serving) == ("e-0", ready, terminating, ready and not terminating)
    assert (p.usable is not None, p.report_unreadable) == (usable, unreadable)


def test_engine_pod_reads_the_slot_the_conditions_and_leaves_the_report_out_of_its_annotations() -> None:
    p = engine_pod(
        pod(UNSCHEDULED, report=encode(REPORT), **{SLOT_ANNOTATION: "2", POD_DELETION_COST_ANNOTATION: "-2"})
    )
    assert (p.slot, p.deletion_cost, p.ip, p.phase, p.resource_version) == (2, "-2", "10.0.0.1", "Running", "7")
    assert p.unschedulable == "0/3 nodes" and p.report == REPORT
    assert dict(p.annotations) == {SLOT_ANNOTATION: "2", POD_DELETION_COST_ANNOTATION: "-2"}
    assert engine_pod(pod(**{SLOT_ANNOTATION: "x"})).slot is None
    assert engine_pod(pod(**{SLOT_ANNOTATION: "²"})).slot is None  # a digit to str.isdigit, not to int()


def test_engine_pods_keep_a_pod_read_earlier_at_the_same_resource_version() -> None:
    first = engine_pods([pod(READY, report=encode(REPORT))])
    changed = pod(READY, report=encode(REPORT))
    changed["metadata"]["resourceVersion"] = "8"
    again = engine_pods([pod(READY, report=encode(REPORT)), changed], known=first)
    assert (
        again[0] is first[0]
        and again[1] is not first[0]
        and again[1] == EnginePod(**{**first[0].__dict__, "resource_version": "8"})
    )


def test_router_pods_decode_each_window_once_and_say_which_are_going() -> None:
    window = RequestWindow(window_s=10.0, end=1000.0, counts={"a": 5}, other=0)
    items = [
        {"metadata": {"name": "r-0", "annotations": {REQUESTS: encode_requests(window)}}},
        {
            "metadata": {
                "name": "r-1",
                "annotations": {REQUESTS: '{"v": 9}'},
                "deletionTimestamp": "2026-12-03T00:00:00Z",
            }
        },
        {"metadata": {"name": "r-2"}},
    ]
    assert router_pods(items) == (
        RouterPod("r-0", terminating=False, requests=window),
        RouterPod("r-1", terminating=True, requests=None),  # unreadable: no window, not an error
        RouterPod("r-2"),
    )
