"""Faults the operator survives against the real control plane, with nothing lost.

- The operator SIGKILLed at random points of reconciles, again and again: the end state equals
  the desired state, with no duplicate or orphaned object. The kill points come from a seed the
  test prints (``LORAPOOL_FAULT_SEED=<n>`` repeats a run).
- etcd and kube-apiserver restarted under a running operator: the change made after the
  restart is reconciled (a leader that lost its Lease meanwhile exits non-zero and is restarted,
  as its Pod would be).
- Status overwritten by another writer: the next resync writes the truth back.

Other faults are covered where the behaviour lives: a standby taking over from a killed leader
(tests/controller/test_operator.py::test_leader_crash_standby_takes_over), sources down, slow,
corrupt or sha-mismatched and engine restarts (tests/sidecar/test_sidecar_e2e.py), a backend
dying mid-stream and every backend down (tests/router/test_router_process.py).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorapool.render.names import POOL_LABEL
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import adapter_dir, apply, condition, get, pool_doc, ready

pytestmark = pytest.mark.cluster

OWNED_KINDS = "deployments,services,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets,networkpolicies"
IDENTITY = "fault-test-operator"  # a restarted container keeps its Pod's name: it takes its Lease back at once


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("LORAPOOL_FAULT_SEED") or random.SystemRandom().randrange(2**31))
    print(f"LORAPOOL_FAULT_SEED={value}")  # shown with a failure: set it to replay the same kill points
    return value


def owned(cluster: LocalCluster, ns: str, pool: str) -> list[tuple[str, str]]:
    """(kind, name) of every object labelled as the pool's, sorted: duplicates would show twice."""
    raw = cluster.kubectl("get", OWNED_KINDS, "-n", ns, "-l", f"{POOL_LABEL}={pool}", "-o", "json").stdout
    return sorted((item["kind"], item["metadata"]["name"]) for item in json.loads(raw)["items"])


def converged(cluster: LocalCluster, ns: str, name: str, adapters: set[str], replicas: int) -> dict[str, Any] | None:
    """The pool Ready at its generation, with exactly the desired adapters and replicas applied."""
    pool = ready(cluster, ns, name)
    if pool is None:
        return None
    config = get(cluster, "configmap", ns, f"{name}-adapters") or {}
    listed = {
        a["name"] for a in json.loads(next(iter((config.get("data") or {"": "{}"}).values()))).get("adapters", [])
    }
    deployment = get(cluster, "deployment", ns, f"{name}-engine") or {}
    if listed != adapters or deployment.get("spec", {}).get("replicas") != replicas:
        return None
    return pool


def test_operator_killed_at_random_points_converges(
    local_cluster: LocalCluster,
    operator: OperatorProcess,
    start_operator: Callable[..., OperatorProcess],
    ns: str,
    tmp_path: Path,
    seed: int,
) -> None:
    rng = random.Random(seed)
    sources = {f"a{i}": adapter_dir(tmp_path, f"a{i}", 8, seed=i) for i in range(6)}
    operator.stop(kill=True)  # the shared leader: ours takes over once its Lease expires
    current = start_operator("--identity", IDENTITY)
    baseline: list[tuple[str, str]] | None = None
    adapters: set[str] = {"a0"}
    replicas = 1
    try:
        for round_ in range(4):
            adapters = set(rng.sample(sorted(sources), rng.randint(1, len(sources))))
            replicas = rng.randint(1, 3)
            spec = [{"name": a, "source": sources[a]} for a in sorted(adapters)]
            apply(local_cluster, pool_doc(ns, "chaos", spec, replicas=replicas))
            kill_after_s = rng.uniform(0.0, 2.0)
            time.sleep(kill_after_s)  # the fault's random point, not a wait for a condition
            current.stop(kill=True)
            print(f"round {round_}: adapters={sorted(adapters)} replicas={replicas} killed after {kill_after_s:.2f} s")
            current = start_operator("--identity", IDENTITY)
            wait_until(
                f"round {round_} converged",
                lambda want=adapters, n=replicas: converged(local_cluster, ns, "chaos", want, n),  # type: ignore[misc]
                120,
                interval_s=0.5,
                describe=lambda: get(local_cluster, "lorapool", ns, "chaos"),
            )
            objects = owned(local_cluster, ns, "chaos")
            assert len(objects) == len(set(objects)), objects
            baseline = baseline or objects
            assert objects == baseline, "the set of owned objects changed with the adapters"
    finally:
        current.stop()  # graceful: releases the Lease for the next shared operator


def test_api_server_and_etcd_restart_under_a_running_operator(
    local_cluster: LocalCluster,
    operator: OperatorProcess,
    start_operator: Callable[..., OperatorProcess],
    ns: str,
    tmp_path: Path,
) -> None:
    """The leader cannot renew its Lease while the API is down. Like a controller-runtime
    manager it then exits non-zero (its Pod restarts it) rather than reconcile unfenced; either
    way the change made after the restart is reconciled."""
    one, two = adapter_dir(tmp_path, "one", 8), adapter_dir(tmp_path, "two", 8, seed=1)
    apply(local_cluster, pool_doc(ns, "steady", [{"name": "one", "source": one}], replicas=1))
    wait_until("pool Ready", lambda: converged(local_cluster, ns, "steady", {"one"}, 1), 90)

    local_cluster.restart("etcd", "kube-apiserver")
    adapters = [{"name": "one", "source": one}, {"name": "two", "source": two}]
    wait_until("the API to take the change", lambda: apply(local_cluster, pool_doc(ns, "steady", adapters,
               replicas=1), check=False).returncode == 0, 60, interval_s=0.5)  # fmt: skip
    current = operator
    wait_until(
        "the change reconciled, or the leader gone",
        lambda: converged(local_cluster, ns, "steady", {"one", "two"}, 1) or current.proc.poll() is not None,
        120,
        interval_s=0.5,
    )
    try:
        if current.proc.poll() is not None:  # what the kubelet would do: start the container again
            assert current.proc.returncode != 0, "a leader that lost its Lease must exit non-zero"
            assert "Lost leader Lease" in current.log.read_text(errors="replace")
            current = start_operator("--identity", IDENTITY)
        wait_until(
            "the change after the restart reconciled",
            lambda: converged(local_cluster, ns, "steady", {"one", "two"}, 1),
            120,
            interval_s=0.5,
            describe=lambda: current.log.read_text(errors="replace")[-3000:],
        )
    finally:
        if current is not operator:
            current.stop()  # graceful: releases the Lease for the next shared operator


def test_status_overwritten_by_another_writer_is_set_right(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    apply(local_cluster, pool_doc(ns, "truth", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1))
    wait_until("pool Ready", lambda: ready(local_cluster, ns, "truth"), 90)
    lie = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Vandal", "message": "no",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}  # fmt: skip
    local_cluster.kubectl(
        "patch", "lorapool", "truth", "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(lie)
    )
    pool = wait_until(
        "the operator to restore Ready=True",
        lambda: (
            (p := get(local_cluster, "lorapool", ns, "truth")) and condition(p, "Ready").get("status") == "True" and p
        ),
        60,
        interval_s=0.5,
    )
    assert condition(pool, "Ready").get("reason") != "Vandal"
