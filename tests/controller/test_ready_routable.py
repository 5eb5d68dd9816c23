"""Ready implies routable (issue 48 item 1): from the moment a new LoRAAdapter is Ready (read from the
sidecars' reports), three routers and the endpoint picker serve it, every request, through both doors.

Each router reads the pool's adapter set through the API as the rendered Deployment does
(``--adapters-configmap``, with the router ServiceAccount's own Role), and routes by the sidecars'
reports on the engine pods; the engines are local sims with real sidecars (``LocalEngines``). Loading
is not "not found" (a router that knows the set holds a request for an adapter it names) is shown
deterministically, against reports the test writes, in tests/router/test_adapter_set_cluster.py.
The same pool serves an oci:// adapter pushed to a real registry by the CLI, by digest (issue 45).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.components import Component, start_router
from lorapool_dev.testing.fakekubelet import LocalEngines
from lorapool_dev.testing.peft import base_module_shapes, write_peft_adapter
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.registry import Registry, run_registry
from lorapool_dev.testing.wait import wait_until
from tests.controller.test_operator import BASE, adapter_dir, apply, condition, get
from tests.controller.test_truth import POOL, engines, loraadapter  # noqa: F401 (engines: the fixture)
from tests.router.picker.test_picker_grpc import Stream, body, headers

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ADAPTERS = ("fresh-0", "fresh-1")  # one run per adapter: each is new to every router


@pytest.fixture
def routers(local_cluster: LocalCluster, ns: str, tmp_path: Path, engines: LocalEngines) -> Iterator[list[Component]]:  # noqa: F811
    """Three routers over the pool's engines, as rendered: reports of the engine pods, the adapter set;
    the first also serves the endpoint picker (plaintext gRPC on ``picker_port``)."""
    engines.start()
    wait_until("2 local engines", lambda: len(engines.replicas) == 2, 60)
    kubeconfig = local_cluster.service_account_kubeconfig(ns, names.router(POOL), path=tmp_path / "router.kubeconfig")
    pods = [f"--backend-pod={r.sim.url}={r.pod}" for r in engines.replicas.values()]
    flags = [
        "--report-pods", f"{ns}/{names.selector_string(POOL, 'engine')}", *pods,
        "--adapters-configmap", f"{ns}/{names.adapters_configmap(POOL)}", "--poll-interval", "0.2",
    ]  # fmt: skip
    picker = ["--ext-proc-port", str(PICKER_PORT), "--ext-proc-insecure"]
    started = [
        start_router(engines.backends, extra=[*flags, *(picker if i == 0 else [])], env={"KUBECONFIG": str(kubeconfig)})
        for i in range(3)
    ]
    try:
        yield started
    finally:
        for router in started:
            router.close()


PICKER_PORT = free_port()


def _http(router: str, model: str) -> int:
    host, port = router.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body_ = json.dumps({"model": model, "prompt": "x", "max_tokens": 1})
        conn.request("POST", "/v1/completions", body_, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def _picked(stub: Any, model: str) -> int:
    """The picker's answer: 200 when it named an endpoint, else the immediate response's status."""
    stream = Stream(stub)
    try:
        stream.send(headers(), body(model))
        answer = stream.answer()
        return 200 if answer.HasField("request_headers") else int(answer.immediate_response.status.code)
    finally:
        stream.cancel()


def _hammer(routers: list[Component], stub: Any, model: str, stop: threading.Event) -> Counter[str]:
    """Requests for ``model`` through every door, back to back, until ``stop``: the statuses seen."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def door(name: str, call: Any) -> None:
        while not stop.is_set():
            status = call()
            with lock:
                seen[f"{name}:{status}"] += 1

    threads = [threading.Thread(target=door, args=(r.url, lambda u=r.url: _http(u, model))) for r in routers]
    threads.append(threading.Thread(target=door, args=("picker", lambda: _picked(stub, model))))
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(30)
    return seen


def _one_run(cluster: LocalCluster, ns: str, name: str, routers: list[Component], stub: Any) -> Counter[str]:
    """From the moment ``name`` is Ready, every door asked back to back for a second: every status seen."""
    ready = lambda: condition(get(cluster, "la", ns, name) or {}, "Ready").get("status") == "True"  # noqa: E731
    wait_until(f"{name} Ready", ready, 60, interval_s=0.02)
    stop = threading.Event()
    seen: list[Counter[str]] = []
    hammer = threading.Thread(target=lambda: seen.append(_hammer(routers, stub, name, stop)))
    hammer.start()
    stop.wait(1.0)
    stop.set()
    hammer.join(60)
    return seen[0]


def test_from_ready_every_router_and_the_picker_serve_the_adapter(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, routers: list[Component]
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{PICKER_PORT}") as channel:
        stub = ext_grpc.ExternalProcessorStub(channel)
        for name in ADAPTERS:
            apply(local_cluster, loraadapter(ns, name, adapter_dir(tmp_path, name, 8)))
            statuses = _one_run(local_cluster, ns, name, routers, stub)
            doors = {key.rsplit(":", 1)[0] for key in statuses}
            assert doors == {r.url for r in routers} | {"picker"}, (name, dict(statuses))
            assert all(key.endswith(":200") for key in statuses), (name, dict(statuses))


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """The CNCF registry (htpasswd) on 127.0.0.1. The local sidecars, started after it, inherit the env the
    renderer gives them for spec.credentials.oci: the Secret's login and the registry as plain HTTP."""
    with run_registry(tmp_path / "registry", auth="htpasswd") as running:
        monkeypatch.setenv("LORAPOOL_OCI_AUTH", json.dumps(running.docker_config()))
        monkeypatch.setenv("LORAPOOL_OCI_PLAIN_HTTP", running.host)
        yield running


def test_an_oci_adapter_pushed_by_the_cli_is_served_by_digest_through_every_door(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, registry: Registry, request: pytest.FixtureRequest
) -> None:
    """Issue 45 through the operator: ``lorapool adapter push`` to a real registry, a LoRAAdapter pinned by
    the digest, Ready from the sidecars' reports, then every router and the picker serve it, and its
    status names the digest the sidecars pulled."""
    routers: list[Component] = request.getfixturevalue("routers")  # after `registry`: the sidecars get its env
    assert registry.password is not None
    files = write_peft_adapter(tmp_path / "sql", rank=8, base_model=BASE, module_shapes=base_module_shapes(BASE))
    digest = registry.push(files, f"oci://{registry.host}/team/sql:v1", "--base-model", BASE)
    doc = loraadapter(ns, "oci-sql", f"oci://{registry.host}/team/sql@{digest}")
    doc["spec"]["rank"] = 8  # the operator reads registries without the pool's login (docs/registry.md)
    apply(local_cluster, doc)
    with grpc.insecure_channel(f"127.0.0.1:{PICKER_PORT}") as channel:
        statuses = _one_run(local_cluster, ns, "oci-sql", routers, ext_grpc.ExternalProcessorStub(channel))
    assert {key.rsplit(":", 1)[0] for key in statuses} == {r.url for r in routers} | {"picker"}, dict(statuses)
    assert all(key.endswith(":200") for key in statuses), dict(statuses)
    revision = lambda: (get(local_cluster, "la", ns, "oci-sql") or {}).get("status", {}).get("resolvedRevision")  # noqa: E731
    wait_until("the digest in oci-sql's status", lambda: revision() == digest, 30, describe=revision)
    assert registry.password not in json.dumps(get(local_cluster, "la", ns, "oci-sql"))
