"""The sidecar reads its pool's adapter set through the real kube-apiserver, as the engine pod's
ServiceAccount, bound to the Role the operator renders (``render.rbac.engine_role``).

Real parts: the local control plane, a TokenRequest token of the rendered engine ServiceAccount,
``lorapool sim`` and ``lorapool sidecar --adapters-configmap`` as processes, adapters served over
loopback. The ConfigMaps are the renderer's own output (``render.configmaps.adapters_configmaps``),
written as the operator writes them: shards, then the index.

Proves: the Role allows exactly the get and the name-selected watch the sidecar does and refuses
any other ConfigMap, a list without a name, and every write; a change reaches the engine through the
watch in about a second; a half-written update (an index naming a shard not written yet) is never
acted on, and is taken once the shard lands.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from loopback_http import LoopbackServer
from sidecar_procs import engine_adapters, get_json

from lorapool.api.adapter import AdapterSpec
from lorapool.api.adapterset import CONFIGMAP_KEY, INDEX_KEY, AdapterSet, AdapterSetIndex
from lorapool.api.models import LoRAPool
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.podstatus import api_server
from lorapool.render import names
from lorapool.render.configmaps import adapters_configmaps
from lorapool.render.rbac import engine_role, engine_rolebinding, engine_serviceaccount
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S
from lorapool_dev.testing.accounts import bare_pool
from lorapool_dev.testing.components import LORAPOOL
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess, free_port, start_process
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(CLUSTER_START_S + 150)]

POOL = "watched"
INDEX = names.adapters_configmap(POOL)


@pytest.fixture
def engine_account(local_cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[LoRAPool, Any, Path]]:
    """A namespace with the rendered engine ServiceAccount, Role and RoleBinding in effect; yields the
    pool, an admin CoreV1Api and the engine account's kubeconfig."""
    from kubernetes import client as k8s
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    ns = f"setwatch-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    pool = bare_pool(POOL, ns)
    core.create_namespaced_service_account(ns, engine_serviceaccount(pool))
    rbac.create_namespaced_role(ns, engine_role(pool))
    rbac.create_namespaced_role_binding(ns, engine_rolebinding(pool))
    user = f"system:serviceaccount:{ns}:{names.engine_service_account(POOL)}"
    authz = k8s.AuthorizationV1Api(api)

    def granted() -> bool:  # the authorizer learns of a new binding from its own watch, a moment later
        attributes = k8s.V1ResourceAttributes(namespace=ns, resource="configmaps", verb="watch", name=INDEX)
        review = k8s.V1SubjectAccessReview(
            spec=k8s.V1SubjectAccessReviewSpec(user=user, resource_attributes=attributes)
        )
        status = authz.create_subject_access_review(review).status
        return bool(status is not None and status.allowed)

    wait_until("the engine RoleBinding in effect", granted, 30)
    kubeconfig = local_cluster.service_account_kubeconfig(
        ns, names.engine_service_account(POOL), path=tmp_path / "engine.kubeconfig"
    )
    yield pool, core, kubeconfig
    core.delete_namespace(ns)
    api.close()


def write(core: Any, ns: str, objects: list[dict[str, Any]]) -> None:
    """Create or replace each ConfigMap, in the given order (the operator's: shards, then the index)."""
    from kubernetes.client.exceptions import ApiException

    for obj in objects:
        body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}}
        try:
            core.replace_namespaced_config_map(obj["metadata"]["name"], ns, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            core.create_namespaced_config_map(ns, body)


def rendered(pool: LoRAPool, sources: dict[str, str], shard_bytes: int) -> list[dict[str, Any]]:
    adapters = [PoolAdapter(AdapterSpec(name=n, source=s, rank=8), "LoRAAdapter", n) for n, s in sources.items()]
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, 8) for a in adapters])
    return adapters_configmaps(pool, plan, adapters, shard_bytes=shard_bytes)


def statuses(kubeconfig: Path, ns: str) -> dict[str, int]:
    """What the engine account gets for each request: HTTP status by a short label."""
    server = api_server(kubeconfig)
    base = f"{server.url}/api/v1/namespaces/{ns}/configmaps"
    requests = {
        "get index": ("GET", f"{base}/{INDEX}"),
        "get an unused shard": ("GET", f"{base}/{names.adapter_shard(POOL, 31)}"),
        "watch index": ("GET", f"{base}?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3D{INDEX}"),
        "list index by name": ("GET", f"{base}?fieldSelector=metadata.name%3D{INDEX}"),
        "get another": ("GET", f"{base}/other"),
        "watch another": ("GET", f"{base}?watch=true&timeoutSeconds=1&fieldSelector=metadata.name%3Dother"),
        "list all": ("GET", base),
        "watch all": ("GET", f"{base}?watch=true&timeoutSeconds=1"),
        "delete index": ("DELETE", f"{base}/{INDEX}"),
        "get a secret of the same name": ("GET", f"{server.url}/api/v1/namespaces/{ns}/secrets/{INDEX}"),
    }

    async def ask() -> dict[str, int]:
        headers = {"Authorization": f"Bearer {server.token()}"}
        out = {}
        connector = aiohttp.TCPConnector(ssl=server.ssl_context)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as http:
            for label, (method, url) in requests.items():
                async with http.request(method, url, headers=headers) as resp:
                    out[label] = resp.status
        return out

    return asyncio.run(ask())


def test_the_engine_role_allows_exactly_the_sidecars_reads(engine_account: tuple[LoRAPool, Any, Path]) -> None:
    pool, core, kubeconfig = engine_account
    ns = pool.metadata.namespace
    write(core, ns, rendered(pool, {"one": "hf://org/one"}, 512 * 1024))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "other"}, "data": {"k": "v"}})
    assert statuses(kubeconfig, ns) == {
        "get index": 200,
        "get an unused shard": 404,  # allowed (a shard slot), only absent
        "watch index": 200,
        "list index by name": 200,
        "get another": 403,
        "watch another": 403,
        "list all": 403,
        "watch all": 403,
        "delete index": 403,
        "get a secret of the same name": 403,
    }


@pytest.fixture
def sidecar(
    engine_account: tuple[LoRAPool, Any, Path], sim: RunningProcess, engine_port: int, tmp_path: Path
) -> Iterator[str]:
    """``lorapool sidecar --adapters-configmap`` as the engine account; yields its status URL."""
    pool, _, kubeconfig = engine_account
    port = free_port()
    argv = [
        *LORAPOOL, "sidecar", "--adapters-configmap", f"{pool.metadata.namespace}/{INDEX}",
        "--report-kubeconfig", str(kubeconfig), "--engine", f"http://127.0.0.1:{engine_port}",
        "--adapter-dir", str(tmp_path / "adapters"), "--status-port", str(port),
        "--config-poll-seconds", "5", "--config-resync-seconds", "60", "--health-poll-seconds", "0.2",
        "--resync-seconds", "1", "--backoff-base-seconds", "0.3", "--backoff-cap-seconds", "1.5", "--seed", "1",
    ]  # fmt: skip
    with start_process(argv, f"http://127.0.0.1:{port}/healthz", 30) as proc:
        yield f"http://127.0.0.1:{port}"
        assert proc.popen.poll() is None, proc.output()[-3000:]


def test_a_change_reaches_the_engine_through_the_watch_and_a_half_written_one_never_does(
    engine_account: tuple[LoRAPool, Any, Path], sidecar: str, files: LoopbackServer, engine_port: int, tmp_path: Path
) -> None:
    pool, core, _ = engine_account
    ns = pool.metadata.namespace
    sources = {
        n: files.add_dir(f"/dirs/{n}", write_peft_adapter(tmp_path / n, seed=i))
        for i, n in enumerate(["sql", "chat", "code"])
    }
    write(core, ns, rendered(pool, {"sql": sources["sql"]}, 512 * 1024))  # small: inline in the index
    wait_until("sql loaded", lambda: "sql" in engine_adapters(engine_port), 20)

    # Sharded (a budget that splits two adapters): the watch brings it, not the 60 s re-read.
    two = {"sql": sources["sql"], "chat": sources["chat"]}
    budget = len(rendered(pool, two, 1 << 20)[-1]["data"][CONFIGMAP_KEY]) - 1  # the pair no longer fits one
    objects = rendered(pool, two, budget)
    assert len(objects) > 2
    started = time.monotonic()
    write(core, ns, objects)
    wait_until("chat loaded", lambda: "chat" in engine_adapters(engine_port), 10)
    took = time.monotonic() - started
    assert took < 5.0, f"{took:.2f}s from the index write to the engine holding chat"
    print(f"index write -> adapter loaded: {took:.2f}s")

    # Half-written: the index of the next generation lands before one of its shards.
    objects = rendered(pool, {**two, "code": sources["code"]}, budget)
    index = AdapterSetIndex.from_json(objects[-1]["data"][INDEX_KEY])
    late = next(
        o for o in objects[:-1] if "code" in {a.name for a in AdapterSet.from_json(o["data"][CONFIGMAP_KEY]).adapters}
    )
    assert late["metadata"]["name"] in {s.name for s in index.shards}
    write(core, ns, [o for o in objects if o is not late])

    def refused() -> str | None:
        error: str | None = get_json(f"{sidecar}/status")["config"]["error"]
        return error if error and f"shard {late['metadata']['name']}" in error else None

    wait_until("the sidecar sees the half-written set", refused, 10)
    assert set(engine_adapters(engine_port)) == {"sql", "chat"}  # never loaded from a half-written set
    write(core, ns, [late])  # the shard lands: the sidecar's re-read (it retries while inconsistent) takes it
    wait_until("code loaded", lambda: "code" in engine_adapters(engine_port), 15)
    wait_until("the error cleared", lambda: get_json(f"{sidecar}/status")["config"]["error"] is None, 10)
