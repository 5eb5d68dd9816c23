"""spec.router.sharedState in a real control plane (docs/high-availability.md): the API server refuses
a bad one with the CRD's words; the operator, with deploy/rbac.yaml's rights, applies the rendered
store and the routers' budget, says SharedBooks, and deletes them when the spec stops asking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import adapter_dir, apply, condition, get, pool_doc

pytestmark = pytest.mark.cluster

STORE_KINDS = ("deployment", "service", "networkpolicy")


@pytest.mark.parametrize(
    ("shared", "words"),
    [
        ({"url": "redis://user:secret@cache:6379/0"}, "must not carry credentials"),
        ({"url": "redis://cache:6379", "rendered": {}}, "sets both url and rendered"),
        ({}, "must be url (a store you run) or rendered"),
        ({"rendered": {"maxMemory": "4Mi"}}, "maxMemory must be a Kubernetes quantity from 8Mi to 64Gi"),
        ({"url": "redis://cache:6379/16"}, "DB 0-15"),
    ],
    ids=["credentials-in-url", "both", "neither", "too-small", "db-16"],
)
def test_the_api_server_refuses_a_bad_shared_state(
    local_cluster: LocalCluster, operator_env: Path, ns: str, shared: dict[str, Any], words: str
) -> None:
    doc = pool_doc(ns, "refused", [], replicas=1)
    doc["spec"]["router"] = {"sharedState": shared}
    result = apply(local_cluster, doc, check=False)
    assert result.returncode != 0 and words in result.stderr, result.stderr
    assert "spec.router.sharedState" in result.stderr
    assert "secret@" not in result.stderr  # the refusal does not repeat the password


def test_the_rendered_store_and_the_budget_come_and_go_with_the_spec(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    doc = pool_doc(ns, "ha", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1)
    doc["spec"]["router"] = {"replicas": 2, "sharedState": {"rendered": {"maxMemory": "16Mi"}}}
    apply(local_cluster, doc)
    store = wait_until(
        "the rendered store applied",
        lambda: (
            all(get(local_cluster, k, ns, "ha-books") for k in STORE_KINDS)
            and get(local_cluster, "deploy", ns, "ha-books")
        ),
        90,
    )
    pool = get(local_cluster, "lorapool", ns, "ha")
    assert pool is not None and store["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    pdb = wait_until("the routers' budget", lambda: get(local_cluster, "pdb", ns, names.router("ha")), 60)
    assert pdb["spec"]["maxUnavailable"] == 1
    router = get(local_cluster, "deploy", ns, names.router("ha"))
    assert router is not None
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--shared-state") + 1] == f"redis://ha-books.{ns}.svc:6379/0"
    assert args[args.index("--shared-state-key") + 1] == pool["metadata"]["uid"]
    shared = wait_until(
        "the SharedBooks condition", lambda: condition(get(local_cluster, "lorapool", ns, "ha"), "SharedBooks"), 90
    )
    assert shared["status"] in ("Unknown", "True", "False"), shared  # the routers' reports decide which

    # One router, no store: the operator deletes what it no longer renders (deploy/rbac.yaml allows it).
    doc["spec"]["router"] = {"replicas": 1}
    apply(local_cluster, doc)
    wait_until(
        "the store and the budget deleted",
        lambda: (
            not any(get(local_cluster, k, ns, "ha-books") for k in STORE_KINDS)
            and get(local_cluster, "pdb", ns, names.router("ha")) is None
        ),
        90,
        describe=lambda: json.dumps({k: bool(get(local_cluster, k, ns, "ha-books")) for k in STORE_KINDS}),
    )
    gone = wait_until(
        "SharedBooks gone with one router and no store",
        lambda: (
            (p := get(local_cluster, "lorapool", ns, "ha"))
            and p["status"].get("observedGeneration") == p["metadata"]["generation"]
            and not condition(p, "SharedBooks")
            and p
        ),
        90,
    )
    assert gone is not None
    assert operator.proc.poll() is None
