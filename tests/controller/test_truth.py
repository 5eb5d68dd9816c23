"""Status tells the truth (issue 10): an adapter is Ready only once an engine holds it, as the
sidecars report on their own Pods. The operator runs against the local control plane; each
engine pod the Deployment created gets a local sim and a sidecar that follows the pool's
ConfigMap as the kubelet projects it and reports with the engine ServiceAccount's token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorapool.api.report import ANNOTATION, SYNCED_CONDITION, decode
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.fakekubelet import LocalEngines
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import BASE, adapter_dir, apply, condition, get, pool_doc, ready

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

POOL = "truth"


def loraadapter(ns: str, name: str, source: str) -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"poolRef": {"name": POOL}, "source": source},
    }


def engine_pods(cluster: LocalCluster, ns: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"lorapool.io/pool={POOL},app.kubernetes.io/component=engine",
                          "-o", "json").stdout  # fmt: skip
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def engine_models(engines: LocalEngines) -> list[set[str]]:
    import urllib.request

    sets = []
    for url in engines.backends:
        cards = json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=5).read())["data"]
        sets.append({c["id"] for c in cards if c.get("parent")})
    return sets


def pool_adapter(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    pool = get(cluster, "lorapool", ns, POOL) or {}
    return next((a for a in (pool.get("status") or {}).get("adapters") or [] if a["name"] == name), {})


@pytest.fixture
def engines(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path, admin: Any
) -> Iterator[LocalEngines]:
    """A 2-replica pool with one inline adapter; its local engines (sims refusing rank > 8) start when
    the test calls ``start()`` and stop at the end."""
    apply(local_cluster, pool_doc(ns, POOL, [{"name": "inline-a", "source": adapter_dir(tmp_path, "inline-a", 8)}]))
    wait_until("pool Ready", lambda: ready(local_cluster, ns, POOL), 90)
    wait_until("2 engine pods", lambda: len(engine_pods(local_cluster, ns)) == 2, 30)
    token = local_cluster.service_account_kubeconfig(ns, f"{POOL}-engine", path=tmp_path / "engine-sa.kubeconfig")
    sim = {"served_model_name": BASE, "max_loras": 4, "max_lora_rank": 8, "max_cpu_loras": 8, "time_scale": 0}
    with LocalEngines(admin, ns, POOL, tmp_path / "engines", sim_flags=sim, report_kubeconfig=token) as e:
        yield e


def test_adapter_is_ready_only_once_replicas_load_it_and_deletion_unloads_it(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, engines: LocalEngines
) -> None:
    # Before any sidecar runs, an applied adapter is Accepted but not Ready.
    apply(local_cluster, loraadapter(ns, "legal", adapter_dir(tmp_path, "legal", 8)))
    la = wait_until(
        "legal Accepted",
        lambda: (o := get(local_cluster, "la", ns, "legal")) and condition(o, "Accepted").get("status") == "True" and o,
        30,
    )
    assert condition(la, "Ready")["status"] == "False" and condition(la, "Ready")["reason"] == "Loading"
    assert la["status"]["phase"] == "Loading" and la["status"]["loadedReplicas"] == 0

    # The kubelet's part: engines for both pods; their sidecars load and report.
    engines.start()
    la = wait_until(
        "legal Ready on 2 replicas",
        lambda: (o := get(local_cluster, "la", ns, "legal")) and o["status"].get("loadedReplicas") == 2 and o,
        60,
    )
    assert condition(la, "Ready")["status"] == "True" and la["status"]["phase"] == "Ready"
    local_cluster.kubectl("wait", "--for=condition=Ready", "la/legal", "-n", ns, "--timeout=5s")
    assert all("legal" in models for models in engine_models(engines))
    printed = local_cluster.kubectl("get", "la", "legal", "-n", ns).stdout.splitlines()
    assert printed[0].split()[5] == "LOADED" and printed[1].split()[5] == "2", printed
    wait_until("inline-a on 2", lambda: pool_adapter(local_cluster, ns, "inline-a").get("loadedReplicas") == 2, 30)

    for pod in engine_pods(local_cluster, ns):  # the channel: annotation and readiness condition
        report = decode(pod["metadata"]["annotations"][ANNOTATION])
        assert report is not None and report.adapters["legal"].phase == "Loaded"
        synced = next(c for c in pod["status"]["conditions"] if c["type"] == SYNCED_CONDITION)
        assert synced["status"] == "True" and synced["reason"] == "Synced"

    # loadedReplicas follows the replicas: scaled to 1, then back to 2 (a new pod that loads it first).
    def loaded() -> int | None:
        return (get(local_cluster, "la", ns, "legal") or {}).get("status", {}).get("loadedReplicas")

    local_cluster.kubectl("scale", "lp", POOL, "-n", ns, "--replicas=1")
    wait_until("legal on 1 replica", lambda: loaded() == 1 and len(engines.replicas) == 1, 60)
    local_cluster.kubectl("scale", "lp", POOL, "-n", ns, "--replicas=2")
    wait_until("legal back on 2 replicas", lambda: loaded() == 2, 90)

    # Deleting the LoRAAdapter unloads it from every engine and from the pool's status.
    local_cluster.kubectl("delete", "la", "legal", "-n", ns)
    wait_until("legal unloaded everywhere", lambda: all("legal" not in m for m in engine_models(engines)), 60)
    wait_until("legal gone from the pool's status", lambda: not pool_adapter(local_cluster, ns, "legal"), 30)


def test_a_load_the_engines_refuse_is_a_condition_and_a_warning_event_with_their_reason(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, engines: LocalEngines
) -> None:
    # Rank 16 is valid for the pool (max-lora-rank becomes 16), but these engines run with 8:
    # the engine refuses the load, and the user reads the engine's reason in the API.
    engines.start()
    apply(local_cluster, loraadapter(ns, "wide", adapter_dir(tmp_path, "wide", 16)))
    la = wait_until(
        "wide LoadFailed",
        lambda: (
            (o := get(local_cluster, "la", ns, "wide")) and condition(o, "Ready").get("reason") == "LoadFailed" and o
        ),
        90,
    )
    ready_cond = condition(la, "Ready")
    assert ready_cond["status"] == "False" and "greater than max_lora_rank 8" in ready_cond["message"]
    assert condition(la, "Accepted")["status"] == "True"  # the adapter itself is valid
    assert condition(la, "Degraded")["status"] == "True" and la["status"]["phase"] == "Failed"
    assert la["status"]["loadedReplicas"] == 0

    def warning() -> dict[str, Any] | None:
        out = local_cluster.kubectl("get", "events", "-n", ns, "-o", "json",
                                    "--field-selector", "involvedObject.name=wide,reason=LoadFailed").stdout  # fmt: skip
        return next(iter(json.loads(out)["items"]), None)

    event = wait_until("LoadFailed Event", warning, 30)
    assert event["type"] == "Warning" and "greater than max_lora_rank 8" in event["message"]
    assert event["lastTimestamp"] and event["firstTimestamp"]  # `kubectl describe` shows an age, not <unknown>
    pool_entry = wait_until("pool lists wide Failed", lambda: pool_adapter(local_cluster, ns, "wide").get("phase") == "Failed"
                            and pool_adapter(local_cluster, ns, "wide"), 30)  # fmt: skip
    assert "greater than max_lora_rank 8" in pool_entry["message"]
    # The working inline adapter is served on both replicas (once the pods that rank 16 rolled are back).
    wait_until("inline-a on 2", lambda: pool_adapter(local_cluster, ns, "inline-a").get("loadedReplicas") == 2, 90)


def test_the_sidecars_account_may_patch_pod_status_in_its_namespace_and_nothing_else(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, engines: LocalEngines
) -> None:
    def can(*args: str) -> str:
        result = local_cluster.kubectl(
            "auth", "can-i", *args, kubeconfig=tmp_path / "engine-sa.kubeconfig", check=False
        )
        return result.stdout.strip()

    assert can("patch", "pods", "--subresource=status", "-n", ns) == "yes"
    assert can("patch", "pods", "-n", ns) == "no"  # never the spec
    assert can("get", "pods", "-n", ns) == "no"
    assert can("patch", "pods", "--subresource=status", "-n", "default") == "no"
    assert can("get", "secrets", "-n", ns) == "no"


def test_a_sidecar_that_may_not_report_says_why_and_keeps_serving(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, engines: LocalEngines
) -> None:
    """Reporting as an account without the right: the sidecar logs the API's refusal, shows it in
    /status, counts it, backs off, and still loads adapters into its engine."""
    import urllib.request

    from lorapool_dev.testing.components import start_sidecar, start_sim
    from lorapool_dev.testing.projection import ConfigMapVolume

    local_cluster.kubectl("create", "serviceaccount", "no-rights", "-n", ns)  # the router's may patch pods/status
    wrong = local_cluster.service_account_kubeconfig(ns, "no-rights", path=tmp_path / "no-rights.kubeconfig")
    pod = engine_pods(local_cluster, ns)[0]["metadata"]["name"]
    with (
        ConfigMapVolume(engines.api_client, ns, f"{POOL}-adapters", tmp_path / "cm").start() as volume,
        start_sim(served_model_name=BASE, max_lora_rank=8, time_scale=0) as sim,
        start_sidecar(
            config=volume.path("adapters.json"), engine_url=sim.url, adapter_dir=tmp_path / "ad",
            extra=["--pod", f"{ns}/{pod}", "--report-kubeconfig", str(wrong), "--report-interval-seconds", "0.5",
                   "--config-poll-seconds", "0.3"],
        ) as sidecar,
    ):  # fmt: skip

        def status() -> dict[str, Any]:
            return dict(json.loads(urllib.request.urlopen(f"{sidecar.url}/status", timeout=5).read()))

        refused = wait_until("a refused report", lambda: "403" in str(status()["report"]["error"]) and status(), 30)
        assert refused["report"]["writes"] == 0 and refused["report"]["pod"] == f"{ns}/{pod}"
        wait_until("inline-a loaded anyway", lambda: any(
            a["name"] == "inline-a" and a["phase"] == "Loaded" for a in status()["adapters"]), 30)  # fmt: skip
        metrics = urllib.request.urlopen(f"{sidecar.url}/metrics", timeout=5).read().decode()
        assert 'lorapool_sidecar_report_writes_total{result="error"}' in metrics
        assert "Failed to report adapters on Pod" in sidecar.proc.output()
