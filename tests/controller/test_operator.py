"""The operator against a real kube-apiserver, scheduler, controller-manager and KWOK GPU nodes."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import free_port, start_process
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess

pytestmark = pytest.mark.cluster

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


def pool_doc(ns: str, name: str, adapters: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
        "gpu": {"product": "A100-80GB", "count": 1},
        "replicas": 2,
        "adapters": adapters,
        "lora": {"maxLoras": "auto", "maxLoraRank": "auto", "maxCpuLoras": "auto"},
        "vllm": {"maxModelLen": 8192, "gpuMemoryUtilization": 0.9},
    }
    body.update(spec)
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


def apply(cluster: LocalCluster, doc: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc), check=check)


def get(cluster: LocalCluster, kind: str, ns: str, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def ready(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    pool = get(cluster, "lorapool", ns, name)
    ok = condition(pool, "Ready").get("status") == "True"
    current = pool and (pool.get("status") or {}).get("observedGeneration") == pool["metadata"]["generation"]
    return pool if ok and current else None


def adapter_dir(tmp_path: Path, name: str, rank: int, **kw: Any) -> str:
    return "file://" + str(write_peft_adapter(tmp_path / name, rank=rank, base_model=BASE, **kw))


def node_of(cluster: LocalCluster, ns: str, selector: str) -> list[str]:
    pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout)["items"]
    return [p["spec"].get("nodeName") for p in pods]


def pool_event_reasons(cluster: LocalCluster, ns: str, name: str) -> set[str]:
    """The reasons of the Events posted on LoRAPool ``name``."""
    selector = f"involvedObject.kind=LoRAPool,involvedObject.name={name}"
    out = cluster.kubectl("get", "events", "-n", ns, "--field-selector", selector, "-o", "json").stdout
    return {e["reason"] for e in json.loads(out)["items"]}


def test_pool_reconciles_to_ready_with_children_plan_and_placement(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    adapters = [
        {"name": "sql-coder", "source": adapter_dir(tmp_path, "sql", 16)},
        {"name": "support-bot", "source": adapter_dir(tmp_path, "bot", 8), "rank": 8},
    ]
    apply(local_cluster, pool_doc(ns, "llama3-8b", adapters))
    pool = wait_until("pool Ready", lambda: ready(local_cluster, ns, "llama3-8b"), 90)
    status = pool["status"]
    assert status["plan"]["maxLoraRank"] == 16 and status["plan"]["maxLoras"] == 8
    assert status["readyReplicas"] == 2 and status["endpoint"] == f"http://llama3-8b.{ns}.svc:8000/v1"
    assert {a["name"]: a["rank"] for a in status["adapters"]} == {"sql-coder": 16, "support-bot": 8}
    assert condition(pool, "Degraded")["status"] == "False"
    assert condition(pool, "Progressing")["status"] == "False"

    for kind, name in [
        ("deployment", "llama3-8b-engine"),
        ("deployment", "llama3-8b-router"),
        ("service", "llama3-8b"),
        ("service", "llama3-8b-engine"),
        ("configmap", "llama3-8b-adapters"),
        ("pdb", "llama3-8b-engine"),
        ("role", "llama3-8b-router"),
        ("rolebinding", "llama3-8b-router"),
        ("serviceaccount", "llama3-8b-router"),
    ]:
        child = get(local_cluster, kind, ns, name)
        assert child is not None, f"{kind}/{name} missing"
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["kind"] == "LoRAPool" and owner["uid"] == pool["metadata"]["uid"]

    nodes = node_of(local_cluster, ns, "app.kubernetes.io/component=engine")
    assert len(nodes) == 2 and all(n.startswith("gpu-a100-80gb-") for n in nodes), nodes

    printed = local_cluster.kubectl("get", "lp", "-n", ns).stdout
    assert "llama3-8b" in printed and "True" in printed and BASE in printed
    # The operator posts a status change's Events after it writes the status: wait for them, not for Ready.
    wait_until(
        "PoolReady and PlanChanged Events",
        lambda: {"PoolReady", "PlanChanged"} <= pool_event_reasons(local_cluster, ns, "llama3-8b"),
        30,
        describe=lambda: pool_event_reasons(local_cluster, ns, "llama3-8b"),
    )
    local_cluster.kubectl("wait", "--for=condition=Ready", "lp/llama3-8b", "-n", ns, "--timeout=5s")


def test_resync_of_an_unchanged_pool_writes_nothing(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    apply(local_cluster, pool_doc(ns, "quiet", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1))
    wait_until("pool Ready", lambda: ready(local_cluster, ns, "quiet"), 90)
    # Other tests' namespaces may still be winding down: wait until the operator is quiet.
    quiet = {"writes": -1.0, "since": time.monotonic()}

    def settled() -> bool:
        writes = operator.metric("lorapool_operator_writes_total")
        if writes != quiet["writes"]:
            quiet.update(writes=writes, since=time.monotonic())
        return time.monotonic() - quiet["since"] > 5

    wait_until("operator quiet", settled, 60)
    before_writes = operator.metric("lorapool_operator_writes_total")
    before_reconciles = operator.metric("lorapool_operator_reconciles_total")
    versions = {
        k: get(local_cluster, k, ns, n)["metadata"]["resourceVersion"]  # type: ignore[index]
        for k, n in [("lorapool", "quiet"), ("deployment", "quiet-engine"), ("configmap", "quiet-adapters")]
    }
    wait_until(
        "two resyncs", lambda: operator.metric("lorapool_operator_reconciles_total") >= before_reconciles + 2, 30
    )
    assert operator.metric("lorapool_operator_writes_total") == before_writes
    after = {
        k: get(local_cluster, k, ns, n)["metadata"]["resourceVersion"]  # type: ignore[index]
        for k, n in [("lorapool", "quiet"), ("deployment", "quiet-engine"), ("configmap", "quiet-adapters")]
    }
    assert after == versions


def test_loraadapter_joins_without_rolling_pods_and_rank_change_rolls(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    apply(
        local_cluster, pool_doc(ns, "teams", [{"name": "base-a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1)
    )
    pool = wait_until("pool Ready", lambda: ready(local_cluster, ns, "teams"), 90)
    template_hash = (
        pool
        and get(local_cluster, "deployment", ns, "teams-engine")["spec"]["template"]["metadata"][  # type: ignore[index]
            "annotations"
        ]["lorapool.io/config-hash"]
    )

    adapter = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": "legal", "namespace": ns},
        "spec": {"poolRef": {"name": "teams"}, "source": adapter_dir(tmp_path, "legal", 8)},
    }
    apply(local_cluster, adapter)

    def in_configmap() -> bool:
        cm = get(local_cluster, "configmap", ns, "teams-adapters") or {"data": {"adapters.json": "{}"}}
        return "legal" in [a["name"] for a in json.loads(cm["data"]["adapters.json"]).get("adapters", [])]

    wait_until("adapter in ConfigMap", in_configmap, 30)
    # Accepted, not Ready: no sidecar runs in this test to load it (test_truth.py covers Ready).
    la = wait_until(
        "LoRAAdapter Accepted",
        lambda: (
            condition(get(local_cluster, "la", ns, "legal"), "Accepted").get("status") == "True"
            and get(local_cluster, "la", ns, "legal")
        ),
        30,
    )
    assert la["status"]["rank"] == 8 and la["status"]["pool"] == "teams"
    engine = get(local_cluster, "deployment", ns, "teams-engine")
    assert engine["spec"]["template"]["metadata"]["annotations"]["lorapool.io/config-hash"] == template_hash  # type: ignore[index]

    # A rank-64 adapter needs --max-lora-rank 64: the flags change and the engine pods roll.
    apply(
        local_cluster,
        {
            **adapter,
            "metadata": {"name": "wide", "namespace": ns},
            "spec": {"poolRef": {"name": "teams"}, "source": adapter_dir(tmp_path, "wide", 64)},
        },
    )

    def rolled() -> bool:
        d = get(local_cluster, "deployment", ns, "teams-engine") or {}
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        return (
            args[args.index("--max-lora-rank") + 1] == "64"
            and d["spec"]["template"]["metadata"]["annotations"]["lorapool.io/config-hash"] != template_hash
        )

    wait_until("engine rolled to rank 64", rolled, 30)
    wait_until("pool Ready again", lambda: ready(local_cluster, ns, "teams"), 90)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["spec"]["adapters"][0].update(rank=600), "spec.adapters[0].rank"),
        (lambda d: d["spec"]["adapters"].append(dict(d["spec"]["adapters"][0])), "Duplicate value"),
        (lambda d: d["spec"]["lora"].update(maxLoras=8, maxCpuLoras=4), "maxCpuLoras must be >= maxLoras"),
        (lambda d: d["spec"]["lora"].update(maxLoraRank=48), "maxLoraRank must be 'auto' or one of vLLM's ranks"),
        (lambda d: d["spec"]["gpu"].update(product="T4"), "spec.gpu.product"),
        (lambda d: d["spec"]["adapters"][0].update(name="Bad_Name"), "spec.adapters[0].name"),
        (lambda d: d["metadata"].update(name="x" * 45), "at most 40 characters"),
    ],
    ids=["rank-600", "duplicate-name", "cpu-below-gpu", "rank-48", "unknown-gpu", "bad-adapter-name", "long-name"],
)
def test_bad_input_is_refused_at_apply_time(
    local_cluster: LocalCluster, operator_env: Path, ns: str, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = pool_doc(ns, "bad", [{"name": "a", "source": "hf://org/a", "rank": 8}])
    mutate(doc)
    result = apply(local_cluster, doc, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_pool_for_a_gpu_nobody_has_is_pending_with_a_clear_condition(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    apply(
        local_cluster,
        pool_doc(
            ns,
            "h100",
            [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}],
            gpu={"product": "H100-80GB"},
            replicas=1,
        ),
    )

    def unschedulable() -> dict[str, Any] | None:
        pool = get(local_cluster, "lorapool", ns, "h100")
        return pool if condition(pool, "Degraded").get("reason") == "Unschedulable" else None

    pool = wait_until("Unschedulable condition", unschedulable, 60)
    assert "NVIDIA-H100-80GB-HBM3" in condition(pool, "Degraded")["message"]
    assert condition(pool, "Ready")["status"] == "False"


def test_a100_40gb_pool_lands_on_the_40gb_node(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    apply(
        local_cluster,
        pool_doc(
            ns,
            "small",
            [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}],
            gpu={"product": "A100-40GB"},
            replicas=1,
        ),
    )
    wait_until("pool Ready", lambda: ready(local_cluster, ns, "small"), 90)
    assert node_of(local_cluster, ns, "app.kubernetes.io/component=engine") == ["gpu-a100-40gb-0"]


def test_scale_subresource_and_deletion(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    apply(local_cluster, pool_doc(ns, "scaled", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1))
    wait_until("pool Ready", lambda: ready(local_cluster, ns, "scaled"), 90)
    local_cluster.kubectl("scale", "lp/scaled", "-n", ns, "--replicas=3")
    pool = wait_until(
        "3 ready replicas",
        lambda: (p := ready(local_cluster, ns, "scaled")) and p["status"]["readyReplicas"] == 3 and p,
        90,
    )
    assert pool["status"]["selector"]
    assert get(local_cluster, "deployment", ns, "scaled-engine")["spec"]["replicas"] == 3  # type: ignore[index]

    local_cluster.kubectl("delete", "lp/scaled", "-n", ns)
    wait_until(
        "children garbage-collected",
        lambda: (
            get(local_cluster, "deployment", ns, "scaled-engine") is None
            and get(local_cluster, "configmap", ns, "scaled-adapters") is None
        ),
        60,
    )


def test_unreadable_or_mismatched_adapters_are_conditions_not_crashes(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    adapters = [
        {"name": "good", "source": adapter_dir(tmp_path, "good", 8)},
        {"name": "missing", "source": "file:///nonexistent/adapter"},
        {"name": "dora", "source": adapter_dir(tmp_path, "dora", 8, extra_config={"use_dora": True})},
        {
            "name": "other-base",
            "source": "file://"
            + str(write_peft_adapter(tmp_path / "mistral", rank=8, base_model="mistralai/Mistral-7B-v0.1")),
        },
    ]
    apply(local_cluster, pool_doc(ns, "mixed", adapters, replicas=1))

    def degraded() -> dict[str, Any] | None:
        pool = get(local_cluster, "lorapool", ns, "mixed")
        return (
            pool
            if condition(pool, "Degraded").get("status") == "True" and len(pool["status"].get("adapters", [])) == 4
            else None
        )

    pool = wait_until("Degraded condition", degraded, 60)
    phases = {a["name"]: a["phase"] for a in pool["status"]["adapters"]}
    # "good" is accepted but no sidecar runs here to load it: Loading, never Ready (test_truth.py loads it).
    assert phases == {"good": "Loading", "missing": "Pending", "dora": "Failed", "other-base": "Failed"}
    message = condition(pool, "Degraded")["message"]
    assert "DoRA" in message and "Mistral-7B" in message and "cannot read adapter_config.json" in message
    cm = get(local_cluster, "configmap", ns, "mixed-adapters")
    names = [a["name"] for a in json.loads(cm["data"]["adapters.json"])["adapters"]]  # type: ignore[index]
    assert "dora" not in names and "other-base" not in names and "good" in names
    assert operator.proc.poll() is None


def test_killed_operator_converges_after_restart_and_standby_takes_over(
    local_cluster: LocalCluster,
    start_operator: Callable[..., OperatorProcess],
    operator: OperatorProcess,
    ns: str,
    tmp_path: Path,
) -> None:
    standby = start_operator(wait=False)  # waits for the Lease held by `operator`
    wait_until("standby waiting", lambda: "Waiting for leader Lease" in standby.log.read_text(), 30)
    assert standby.proc.poll() is None
    health = f"http://127.0.0.1:{standby.liveness_port}"
    assert urllib.request.urlopen(f"{health}/healthz", timeout=5).status == 200  # alive: probes must not kill it
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{health}/readyz", timeout=5)
    assert info.value.code == 503

    writes = operator.metric("lorapool_operator_writes_total")
    apply(local_cluster, pool_doc(ns, "crash", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1))
    # killed once it has begun writing the pool's objects: the standby must finish the job
    wait_until("the operator writing", lambda: operator.metric("lorapool_operator_writes_total") > writes, 30)
    operator.stop(kill=True)  # no Lease release: the standby must wait for it to expire
    wait_until("standby leads", lambda: "Acquired leader Lease" in standby.log.read_text(), 40)
    pool = wait_until("pool Ready", lambda: ready(local_cluster, ns, "crash"), 90)
    deployments = json.loads(local_cluster.kubectl("get", "deployments", "-n", ns, "-o", "json").stdout)["items"]
    assert sorted(d["metadata"]["name"] for d in deployments) == ["crash-engine", "crash-router"]
    assert pool["status"]["plan"]["maxLoraRank"] == 8
    standby.stop()  # graceful: releases the Lease for the next shared operator


def test_rank_is_read_from_an_http_source(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    """No rank in the spec: the operator reads adapter_config.json over HTTP (a loopback server)."""
    import sys

    write_peft_adapter(tmp_path / "www" / "coder", rank=48, base_model=BASE)
    port = free_port()
    serve = [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path / "www"),
    ]
    # answering before the pool exists: the test is about reading the rank, not a server still starting
    with start_process(serve, f"http://127.0.0.1:{port}/coder/adapter_config.json", timeout=30):
        source = f"http://127.0.0.1:{port}/coder/"
        apply(local_cluster, pool_doc(ns, "web", [{"name": "coder", "source": source}], replicas=1))
        pool = wait_until("pool Ready", lambda: ready(local_cluster, ns, "web"), 90)
        assert pool["status"]["adapters"][0]["rank"] == 48
        assert pool["status"]["plan"]["maxLoraRank"] == 64  # 48 rounded up to vLLM's next rank
