"""The sizing loop against the local control plane: the operator reads the engine pods' reports
(the one channel), writes status.recommendation, applies it (spec.lora.tuning.apply) as a bounded
step that rolls the engine Deployment, judges the change on windows of engines running the new
value and rolls it back when p99 TTFT got worse, with an Event for each; no second try follows."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from lorapool.api.clock import unix
from lorapool.api.report import ANNOTATION, Observations, ReplicaReport, encode
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import adapter_dir, apply, get, pool_doc, ready

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

POOL = "sized"


def engine_pods(cluster: LocalCluster, ns: str, max_loras: int) -> list[dict[str, Any]]:
    """Ready, live engine pods whose vLLM runs with ``--max-loras max_loras``."""
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"lorapool.io/pool={POOL},app.kubernetes.io/component=engine",
                          "-o", "json").stdout  # fmt: skip
    pods = []
    for pod in json.loads(out)["items"]:
        args = [a for c in pod["spec"]["containers"] for a in c.get("args") or []]
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions") or [])
        flag = args[args.index("--max-loras") + 1] if "--max-loras" in args else None
        if ok and not pod["metadata"].get("deletionTimestamp") and flag == str(max_loras):
            pods.append(pod)
    return pods


def report(cluster: LocalCluster, ns: str, pods: list[dict[str, Any]], **obs: Any) -> None:
    """Write each pod's report as its sidecar would (annotation on its own Pod), with a window."""
    for pod in pods:
        window = Observations(
            **{
                "window_s": 5.0,
                "end": time.time(),
                "samples": 30,
                "distinct_p50": 1.0,
                "distinct_p95": 1.0,
                "distinct_max": 1,
                "slot_wait_s": 0.0,
                "kv_wait_s": 0.0,
                "kv_usage_p50": 0.1,
                "kv_usage_p95": 0.2,
                "kv_usage_max": 0.3,
                "running_p95": 4.0,
                "waiting_p95": 0.0,
                "preemptions": 0,
                "finished": 50,
                "ttft_p50_s": 0.1,
                "ttft_p99_s": 0.5,
                **obs,
            }
        )
        text = encode(ReplicaReport(engine_healthy=True, observations=window))
        cluster.kubectl("annotate", "pod", pod["metadata"]["name"], "-n", ns, f"{ANNOTATION}={text}", "--overwrite")


def status(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    return (get(cluster, "lorapool", ns, POOL) or {}).get("status") or {}


def events(cluster: LocalCluster, ns: str, reason: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", ns, "-o", "json",
                          "--field-selector", f"involvedObject.name={POOL},reason={reason}").stdout  # fmt: skip
    return list(json.loads(out)["items"])


def test_a_change_is_applied_rolled_out_judged_and_rolled_back_once(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Any
) -> None:
    lora = {"maxLoras": "auto", "maxLoraRank": "auto", "maxCpuLoras": "auto",
            "tuning": {"apply": True, "minPeriodSeconds": 60, "maxStepFactor": 2, "rollbackMargin": 0.1}}  # fmt: skip
    apply(local_cluster, pool_doc(ns, POOL, [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], lora=lora))
    pool = wait_until("pool Ready", lambda: ready(local_cluster, ns, POOL), 90)
    assert pool["status"]["plan"]["maxLoras"] == 8  # one adapter: a slot plus cheap spares
    before = wait_until(
        "2 engine pods on 8 slots", lambda: (p := engine_pods(local_cluster, ns, 8)) and len(p) == 2 and p, 60
    )

    # 1. Reports show one adapter in flight: recommend 1 (the pool has one), apply a bounded step (8 -> 4), roll.
    report(local_cluster, ns, before, max_loras=8)
    sizing = wait_until("a change applied", lambda: status(local_cluster, ns).get("sizing"), 30)
    assert (sizing["appliedMaxLoras"], sizing["previousMaxLoras"], sizing["verdict"]) == (4, 8, "Watching")
    assert sizing["baselineTtftP99Seconds"] == 0.5 and sizing["baselineGoodput"] == pytest.approx(20.0)
    assert (
        "shrink to 1" in sizing["reason"]
        and "capped at 1 (the adapter count)" in sizing["reason"]
        and "on 2 replica(s), 60 samples" in sizing["reason"]
    )
    applied = wait_until("a SizingApplied Event", lambda: events(local_cluster, ns, "SizingApplied"), 30)
    message = applied[0]["message"]
    assert "--max-loras 8 -> 4 (bounded step" in message and "p95 1" in message and "KV tokens per GPU" in message
    # the plan follows at once; engines on 4 slots have not reported yet, so the recommendation waits for them
    rec = wait_until(
        "recommendation at 4",
        lambda: (r := status(local_cluster, ns).get("recommendation", {})).get("current") == 4 and r,
        30,
    )
    assert rec["action"] == "InsufficientData" and rec["maxLoras"] == 4
    after = wait_until(
        "2 engine pods on 4 slots", lambda: (p := engine_pods(local_cluster, ns, 4)) and len(p) == 2 and p, 90
    )
    assert wait_until("plan at 4", lambda: status(local_cluster, ns).get("plan", {}).get("maxLoras") == 4, 30)

    # 2. Windows that opened after the change, on engines running 4 slots, with p99 TTFT 4x worse: roll back.
    changed = unix(sizing["lastChangeTime"])
    wait_until("a second past the change", lambda: time.time() - changed >= 2.5, 10)
    report(local_cluster, ns, after, max_loras=4, ttft_p99_s=2.0, window_s=time.time() - changed - 1)
    back = wait_until(
        "rolled back",
        lambda: (s := status(local_cluster, ns).get("sizing") or {}).get("verdict") == "RolledBack" and s,
        30,
    )
    assert (back["appliedMaxLoras"], back["previousMaxLoras"], back["rejectedMaxLoras"]) == (8, 4, 4)
    warning = wait_until("a SizingRolledBack Event", lambda: events(local_cluster, ns, "SizingRolledBack"), 30)
    assert warning[0]["type"] == "Warning" and "p99 TTFT 0.5 s -> 2 s" in warning[0]["message"]
    restored = wait_until(
        "2 engine pods on 8 slots again", lambda: (p := engine_pods(local_cluster, ns, 8)) and len(p) == 2 and p, 90
    )

    # 3. The same evidence again: the recommendation follows it, but no second change is made
    #    (within minPeriodSeconds, and 8 -> 4 was rolled back).
    report(local_cluster, ns, restored, max_loras=8, samples=37)
    wait_until(
        "the new reports read", lambda: status(local_cluster, ns).get("recommendation", {}).get("samples") == 74, 30
    )
    final = status(local_cluster, ns)
    assert final["sizing"]["verdict"] == "RolledBack" and final["sizing"]["appliedMaxLoras"] == 8
    assert final["plan"]["maxLoras"] == 8 and len(events(local_cluster, ns, "SizingApplied")) == 1
