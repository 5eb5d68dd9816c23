"""The operator process: kopf watches wired to the reconcile queue, leader election, metrics.

The only module that imports kopf. Every watch handler just adds the affected pool to the
``WorkQueue`` (``controller.workqueue``), which runs ``PoolReconciler.reconcile`` (a level-based
reconcile) when ``controller.schedule`` says; kopf writes nothing of its own to our objects (no
finalizers, no progress annotations: event handlers only, children are removed by
ownerReferences and the garbage collector).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf
from aiohttp import web
from kubernetes import client
from prometheus_client import start_http_server

from lorapool.api.models import GROUP, VERSION
from lorapool.api.pods import engine_pod
from lorapool.controller.index import AdapterIndex
from lorapool.controller.kube import Kube
from lorapool.controller.leader import LeaseElector
from lorapool.controller.reconcile import PoolReconciler, Settings
from lorapool.controller.schedule import QueueSettings
from lorapool.controller.triggers import Mark, object_mark, pod_mark
from lorapool.controller.workqueue import WorkQueue
from lorapool.kubeconfig import api_client
from lorapool.render.names import POOL_LABEL
from lorapool.sources.base import SourceOptions
from lorapool.sources.config import ConfigCache, fetch_adapter_config

log = logging.getLogger("lorapool.operator")
API_THREADS = 8  # the reconciles' API calls in flight; source reads keep the default executor to themselves


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None
    namespaces: tuple[str, ...]  # empty: every namespace
    settings: Settings
    resync_s: float
    metrics_port: int
    liveness_port: int
    bind: str
    leader_election: bool
    lease_namespace: str
    lease_name: str
    identity: str


def _login(**_: Any) -> kopf.ConnectionInfo:
    """The same credentials the client was configured with (--kubeconfig or in-cluster),
    not kopf's own discovery, which would ignore --kubeconfig."""
    conf = client.Configuration.get_default_copy()
    keys: dict[str, str] = conf.api_key or {}
    token = keys.get("authorization") or keys.get("BearerToken")
    scheme, _space, value = (token or "").partition(" ")
    return kopf.ConnectionInfo(
        server=conf.host,
        ca_path=conf.ssl_ca_cert,
        insecure=not conf.verify_ssl,
        scheme=scheme or None if value else None,
        token=(value or scheme) or None,
        certificate_path=conf.cert_file,
        private_key_path=conf.key_file,
    )


def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False  # we post our own Events with reasons users can filter on
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.inactivity_timeout = 600
    settings.scanning.disabled = True  # resources are known; no need to list CRDs (least privilege)


def build_registry(queue: WorkQueue, index: AdapterIndex | None = None) -> kopf.OperatorRegistry:
    """kopf handlers: login and settings, then watches that only queue the affected pool (and feed
    ``index``, the LoRAAdapters by pool that the reconcile reads instead of listing)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(_login)
    kopf.on.startup(registry=registry)(_configure)
    _watch_pools(registry, queue)
    _watch_adapters(registry, queue, index)
    _watch_children(registry, queue)
    return registry


def _namespace(namespace: str | None) -> str:
    """kopf types ``namespace`` optional for cluster-scoped kinds; every kind watched here is namespaced."""
    if namespace is None:
        raise ValueError("an event without a namespace names no pool; lorapool watches only namespaced kinds")
    return namespace


def _watch_pools(registry: kopf.OperatorRegistry, queue: WorkQueue) -> None:
    """A LoRAPool's own change reconciles it; the echo of our status write does not."""
    seen_pools: dict[tuple[str, str], Mark] = {}  # pool -> what of it last triggered a reconcile

    @kopf.on.event(GROUP, VERSION, "lorapools", registry=registry)
    async def pool_event(type: str | None, namespace: str | None, name: str, meta: kopf.Meta, **_: Any) -> None:
        key = (_namespace(namespace), name)
        if type == "DELETED":
            queue.forget(*key)
            seen_pools.pop(key, None)
            return
        # A change of status alone is the echo of our own write: reconciling again would only
        # write again (a storm while engines load and loadedReplicas moves). The drift resync
        # still reconciles every pool periodically.
        mark = object_mark(meta)
        if seen_pools.get(key) == mark:
            return
        seen_pools[key] = mark
        queue.add(*key)


def _watch_adapters(registry: kopf.OperatorRegistry, queue: WorkQueue, index: AdapterIndex | None) -> None:
    """A LoRAAdapter's change reconciles the pool it points at, and the pool it left; every event,
    status-only ones too, updates ``index`` (what the operator's next status write compares with)."""
    adapter_pools: dict[tuple[str, str], str] = {}  # LoRAAdapter -> the pool it last pointed at
    seen_adapters: dict[tuple[str, str], Mark] = {}  # LoRAAdapter -> what of it last triggered a reconcile

    @kopf.on.event(GROUP, VERSION, "loraadapters", registry=registry)
    async def adapter_event(
        type: str | None,
        namespace: str | None,
        name: str,
        spec: kopf.Spec,
        meta: kopf.Meta,
        event: kopf.RawEvent,
        **_: Any,
    ) -> None:
        ns = _namespace(namespace)
        if index is not None:
            index.observe(type, event["object"])
        adapter: Mapping[str, Any] = spec or {}
        pool = adapter.get("poolRef", {}).get("name")
        if type != "DELETED":  # a status-only change is the echo of our own write (see pool_event)
            mark = object_mark(meta)
            if seen_adapters.get((ns, name)) == mark:
                return
            seen_adapters[(ns, name)] = mark
        else:
            seen_adapters.pop((ns, name), None)
        previous = adapter_pools.get((ns, name))
        if previous and previous != pool:
            queue.add(ns, previous)  # it left that pool
        if type == "DELETED":
            adapter_pools.pop((ns, name), None)
        elif pool:
            adapter_pools[(ns, name)] = pool
        if pool:
            queue.add(ns, pool)


def _watch_children(registry: kopf.OperatorRegistry, queue: WorkQueue) -> None:
    """A child Deployment's change reconciles its pool; engine Pods do, windowed, when what the reconcile reads moved."""
    seen_pods: dict[tuple[str, str], Mark] = {}  # engine Pod -> what of it last triggered (triggers.pod_mark)

    @kopf.on.event("apps", "v1", "deployments", labels={POOL_LABEL: kopf.PRESENT}, registry=registry)
    async def child_event(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        queue.add(_namespace(namespace), labels[POOL_LABEL])

    @kopf.on.event(
        "", "v1", "pods", labels={POOL_LABEL: kopf.PRESENT, "app.kubernetes.io/component": "engine"}, registry=registry
    )
    async def pod_event(
        type: str | None, namespace: str | None, name: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
    ) -> None:
        # Only what the reconcile reads (triggers.pod_mark): not every report write, not observations.
        key = (_namespace(namespace), name)
        if type == "DELETED":
            seen_pods.pop(key, None)
        else:
            mark = pod_mark(engine_pod(body))
            if seen_pods.get(key) == mark:
                return
            seen_pods[key] = mark
        queue.add_windowed(key[0], labels[POOL_LABEL])  # at most once per QueueSettings.window_s


def _stop_if_failed(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    """A queue loop that died reconciles nothing more: stop the operator (its Pod restarts it)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("Stopped the reconcile queue: %r; stopping the operator", exc)
        stop.set()


async def _serve_health(cfg: OperatorConfig, leading: asyncio.Event, kopf_ready: asyncio.Event) -> web.AppRunner:
    """/healthz: the process is alive (standbys too, so probes do not restart them);
    /readyz: this replica leads and kopf's watches are running."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if leading.is_set() and kopf_ready.is_set():
            return web.Response(text="leading")
        return web.Response(status=503, text="standby: waiting for the leader Lease")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, cfg.bind, cfg.liveness_port).start()
    return runner


async def run_operator(cfg: OperatorConfig) -> int:
    api = api_client(cfg.kubeconfig)
    leading, kopf_ready = asyncio.Event(), asyncio.Event()
    try:
        # Both servers start before the Lease: a standby is alive and scrapeable, just not ready.
        start_http_server(cfg.metrics_port, addr=cfg.bind)
        health = await _serve_health(cfg, leading, kopf_ready)
    except OSError as exc:
        log.error(
            "Cannot listen on %s (metrics %s, health %s): %s; choose other ports",
            cfg.bind,
            cfg.metrics_port,
            cfg.liveness_port,
            exc,
        )
        return 2
    elector = None
    if cfg.leader_election:
        elector = LeaseElector(api, cfg.lease_namespace, cfg.lease_name, cfg.identity)
        await elector.acquire()
    leading.set()
    cache = ConfigCache(ttl_s=300)  # sized by the catalogue as pools reconcile (PoolReconciler)
    index = AdapterIndex()

    async def fetch(source: str, revision: str | None, *, options: SourceOptions) -> dict[str, Any]:
        return await fetch_adapter_config(
            source, revision=revision, timeout_s=cfg.settings.metadata_timeout_s, cache=cache, options=options
        )

    api_threads = ThreadPoolExecutor(max_workers=API_THREADS, thread_name_prefix="kube-api")
    reconciler = PoolReconciler(
        Kube(api, cfg.identity), fetch, cfg.settings, index=index, cache=cache, api_threads=api_threads
    )
    queue = WorkQueue(reconciler.reconcile, QueueSettings(resync_s=cfg.resync_s))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(queue.run(), name="queue")]
    tasks[0].add_done_callback(lambda task: _stop_if_failed(task, stop))
    if elector is not None:
        tasks.append(asyncio.create_task(elector.keep(stop), name="lease"))
    try:
        await kopf.operator(
            registry=build_registry(queue, index),
            standalone=True,  # no kopf peering: the Lease above decides who runs
            clusterwide=not cfg.namespaces,
            namespaces=list(cfg.namespaces),
            stop_flag=stop,
            ready_flag=kopf_ready,
        )
    finally:
        for task in tasks:
            task.cancel()
        await health.cleanup()
        api_threads.shutdown(wait=False, cancel_futures=True)
        if elector is not None:
            await asyncio.to_thread(elector.release)
    return 1 if stop.is_set() else 0  # the Lease lost, or the queue loop died
