"""The router routes by the sidecars' reports, read from a real API server.

Real parts: the local control plane (engine Pods on KWOK nodes), two ``lorapool sim`` processes
that both serve every test adapter, and ``lorapool router`` running as a ServiceAccount bound to
the Role the operator renders for it (so the test also proves that Role suffices). The reports
are written on the Pods' status as the sidecars write them (``encode`` + a strategic-merge
PATCH of ``pods/status``), which lets the test put an adapter in each state on purpose:
loaded on one replica only (the router must ignore the other's ``/v1/models``), loading (held,
then 503 with Retry-After; or bound the moment a report says loaded), failed (404 with the
engine's reason) and unknown (404, not in the pool).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from lorapool.api.report import ANNOTATION, AdapterReport, ReplicaReport, encode
from lorapool.api.report import ReplicaPhase as P
from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S
from lorapool_dev.testing.accounts import bare_pool, create_accounts
from lorapool_dev.testing.components import router_argv
from lorapool_dev.testing.processes import RunningProcess, free_port, start_process
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import StartSim
from .test_router_process import client, post

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(CLUSTER_START_S + 150)]

POOL = "reports"
MAX_WAIT_S = 5.0  # room for a report to reach the router while a request is held, on a busy machine
RANK_ERROR = "Call to add_lora method failed: Worker failed with error 'LoRA rank 64 is greater than max_lora_rank 16.'"
IDS = {name: f"{i:016x}" for i, name in enumerate(("sql", "chat", "code", "math"), start=1)}


def entry(name: str, phase: P, message: str | None = None) -> AdapterReport:
    loaded = IDS[name] if phase == P.LOADED else None
    return AdapterReport(phase, IDS[name], loaded, message)


@pytest.fixture
def engine_pods(local_cluster: LocalCluster) -> Iterator[tuple[str, Any, Path]]:
    """A namespace with two engine Pods of pool ``reports`` (Running on fake nodes) and the router's
    ServiceAccount bound to the rendered router Role; yields (namespace, admin client, router kubeconfig)."""
    from kubernetes import client as k8s
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    ns = f"router-reports-{uuid.uuid4().hex[:6]}"
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    create_accounts(core, rbac, bare_pool(POOL, ns), ["router"])
    for i in range(2):
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"{POOL}-engine-{i}", "labels": names.labels(POOL, "engine")},
                "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
            },
        )

    def ready() -> bool:
        pods = core.list_namespaced_pod(ns).items
        return len(pods) == 2 and all(
            any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ()) for p in pods
        )

    wait_until("both engine pods Ready on the fake nodes", ready, 60)
    kubeconfig = local_cluster.service_account_kubeconfig(ns, names.router(POOL))
    yield ns, api, kubeconfig
    core.delete_namespace(ns)
    api.close()


def write_report(api: Any, ns: str, pod: str, **adapters: AdapterReport) -> None:
    """What a sidecar does: its report as the annotation, in one PATCH of its Pod's status."""
    from kubernetes import client as k8s

    text = encode(ReplicaReport(engine_healthy=True, adapters=adapters))
    k8s.CoreV1Api(api).patch_namespaced_pod_status(pod, ns, {"metadata": {"annotations": {ANNOTATION: text}}})


def backend_of(router: str, model: str) -> str:
    resp = client(router).completions.with_raw_response.create(model=model, prompt="x", max_tokens=1)
    return resp.headers["x-lorapool-backend"]


def test_router_routes_by_the_reports_on_the_pods(
    engine_pods: tuple[str, Any, Path], start_sim: StartSim, processes: dict[str, RunningProcess]
) -> None:
    ns, api, kubeconfig = engine_pods
    e0, e1 = f"{POOL}-engine-0", f"{POOL}-engine-1"
    write_report(api, ns, e0, sql=entry("sql", P.LOADED), code=entry("code", P.FAILED, RANK_ERROR))
    write_report(
        api, ns, e1, chat=entry("chat", P.DOWNLOADING), code=entry("code", P.FAILED, RANK_ERROR)
    )  # math: in no report
    sims = [start_sim(time_scale=0), start_sim(time_scale=0)]  # both serve sql, chat, code, math
    port = free_port()
    argv = router_argv(
        port,
        sims,
        extra=[
            "--report-pods", f"{ns}/{names.selector_string(POOL, 'engine')}",
            "--backend-pod", f"{sims[0]}={e0}", "--backend-pod", f"{sims[1]}={e1}",
            "--max-wait", f"{MAX_WAIT_S:g}", "--poll-interval", "0.2", "--backend-header",
        ],
    )  # fmt: skip
    router_proc = start_process(argv, f"http://127.0.0.1:{port}/health", 60, env={"KUBECONFIG": str(kubeconfig)})
    router = f"http://127.0.0.1:{port}"
    processes[router] = router_proc

    # Loaded on e0 only: every request goes there, though e1's /v1/models lists sql too.
    assert {backend_of(router, "sql") for _ in range(6)} == {sims[0]}

    # Loading on e1, loaded nowhere: held for --max-wait, then 503 with Retry-After.
    started = time.monotonic()
    status, headers, raw = post(router, json.dumps({"model": "chat", "prompt": "x", "max_tokens": 1}).encode())
    held_s = time.monotonic() - started
    assert status == 503 and headers["Retry-After"] == "1", raw
    assert "'chat' is loading on 1 replica(s)" in json.loads(raw)["error"]["message"]
    assert MAX_WAIT_S * 0.9 <= held_s < MAX_WAIT_S + 5  # held for --max-wait, then answered (never hangs)

    # Held again, and e1's sidecar reports it loaded meanwhile: bound at once, answered by e1.
    answer: dict[str, Any] = {}

    def ask() -> None:
        started = time.monotonic()
        resp = client(router).completions.with_raw_response.create(model="chat", prompt="x", max_tokens=1)
        answer.update(
            backend=resp.headers["x-lorapool-backend"], model=resp.parse().model, s=time.monotonic() - started
        )

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        wait_until(
            "the chat request to wait in the router",
            lambda: metric(scrape(router), "lorapool_router_queue_depth", model="chat") == 1,
            MAX_WAIT_S,
            interval_s=0.05,
        )
        write_report(api, ns, e1, chat=entry("chat", P.LOADED), code=entry("code", P.FAILED, RANK_ERROR))
    finally:
        asking.join(30)
    assert answer["backend"] == sims[1] and answer["model"] == "chat"
    assert answer["s"] < MAX_WAIT_S, answer  # bound by the report, not by the wait running out

    # Failed on every replica: 404 with the engine's reason, not its generic text.
    with pytest.raises(openai.NotFoundError) as failed:
        client(router).completions.create(model="code", prompt="x", max_tokens=1)
    assert "failed to load on 2 replica(s)" in str(failed.value) and "greater than max_lora_rank 16" in str(
        failed.value
    )
    assert "does not exist" not in str(failed.value)

    # In no report: 404 that says it is not in the pool.
    with pytest.raises(openai.NotFoundError, match="not in the pool's adapter set"):
        client(router).completions.create(model="math", prompt="x", max_tokens=1)

    page = scrape(router)
    assert metric(page, "lorapool_router_backend_reported") == 2
    assert metric(page, "lorapool_router_adapter_requests_total", adapter="sql") == 6
    assert metric(page, "lorapool_router_adapter_requests_total", adapter="sql", result="hit") == 5
    assert metric(page, "lorapool_router_adapter_requests_total", adapter="chat", result="miss") == 1
    assert metric(page, "lorapool_router_queue_wait_seconds_count", reason="load") == 2
    assert metric(page, "lorapool_router_adapter_held_seconds_total", adapter="chat", reason="load") >= MAX_WAIT_S * 0.9


def write_adapter_set(api: Any, ns: str, adapters: list[str]) -> None:
    """What the operator writes: the pool's adapter set, inline in its index ConfigMap ``<pool>-adapters``."""
    from kubernetes import client as k8s

    from lorapool.api.adapterset import AdapterSet, AdapterSetIndex, DesiredAdapter, content_hash

    whole = AdapterSet(
        pool=POOL, base_model="tiny", max_lora_rank=16,
        adapters=tuple(DesiredAdapter(name=n, source=f"file:///adapters/{n}") for n in adapters),
    )  # fmt: skip
    text = whole.to_json()
    data = {"index.json": AdapterSetIndex(pool=POOL, generation=content_hash(text)).to_json(), "adapters.json": text}
    body = {
        "metadata": {"name": names.adapters_configmap(POOL), "labels": names.labels(POOL, "adapters")},
        "data": data,
    }
    core = k8s.CoreV1Api(api)
    try:
        core.replace_namespaced_config_map(names.adapters_configmap(POOL), ns, body)
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_config_map(ns, body)


def test_an_adapter_the_pools_set_names_is_loading_not_missing(
    engine_pods: tuple[str, Any, Path], start_sim: StartSim, processes: dict[str, RunningProcess]
) -> None:
    """Before any sidecar reports a new adapter, the router that reads the pool's adapter set (with its
    rendered Role, by name) holds a request for it and answers 503 with Retry-After, never 404; a name
    the set does not have is 404, and one the set drops becomes 404 as soon as the router sees it."""
    ns, api, kubeconfig = engine_pods
    e0, e1 = f"{POOL}-engine-0", f"{POOL}-engine-1"
    write_report(api, ns, e0, sql=entry("sql", P.LOADED))
    write_report(api, ns, e1, sql=entry("sql", P.LOADED))
    write_adapter_set(api, ns, ["sql", "math"])  # math: in the set, in no report yet
    sims = [start_sim(time_scale=0), start_sim(time_scale=0)]
    port = free_port()
    argv = router_argv(port, sims, extra=[
        "--report-pods", f"{ns}/{names.selector_string(POOL, 'engine')}",
        "--backend-pod", f"{sims[0]}={e0}", "--backend-pod", f"{sims[1]}={e1}",
        "--adapters-configmap", f"{ns}/{names.adapters_configmap(POOL)}", "--max-wait", "1", "--poll-interval", "0.2",
    ])  # fmt: skip
    router = f"http://127.0.0.1:{port}"
    processes[router] = start_process(argv, f"{router}/health", 60, env={"KUBECONFIG": str(kubeconfig)})

    def ask(model: str) -> tuple[int, dict[str, str], str]:
        status, headers, raw = post(router, json.dumps({"model": model, "prompt": "x", "max_tokens": 1}).encode())
        return status, headers, json.loads(raw)["error"]["message"] if status != 200 else ""

    # The router reads the set at start; its first read may race the test: wait for the state it asserts.
    status, headers, message = wait_until("math held, then 503", lambda: (r := ask("math"))[0] == 503 and r, 30)
    assert headers["Retry-After"] == "1" and "'math' is in the pool's adapter set and not loaded" in message
    status, _, message = ask("nope")
    assert status == 404 and "not in the pool's adapter set" in message
    write_adapter_set(api, ns, ["sql"])  # math leaves the pool: the watch tells the router
    wait_until("math answered 404", lambda: ask("math")[0] == 404, 30)
    assert ask("sql")[0] == 200
