"""Wires the router together and runs it: settings -> scheduler, poller, discovery, reports, app.

Shell. Serves only after one poll round (and, with ``--report-pods``, the first list of the
engine Pods), so the first requests see real backend state; stops on SIGINT/SIGTERM, letting
in-flight requests finish for a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from lorapool.api.adapterset import AdapterSet
from lorapool.api.pods import EnginePod
from lorapool.api.routerpolicy import PolicyState
from lorapool.podstatus import ApiServer, PodRef, api_server
from lorapool.render.names import ENGINE_API_KEY_ENV
from lorapool.router.app import build_app
from lorapool.router.core.reports import backend_reports
from lorapool.router.core.requestcount import RequestCounter
from lorapool.router.endpointslices import EndpointSliceWatch, parse_target
from lorapool.router.kubewatch import ListWatch
from lorapool.router.podreports import parse_pods_target, pod_report_watch
from lorapool.router.policyfile import Loaded, PolicyFile, from_flags, read, summary
from lorapool.router.poller import Poller
from lorapool.router.publisher import Publisher
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.sharedbooks import SharedBooks, redacted
from lorapool.router.telemetry import Telemetry
from lorapool.router.trafficfile import TrafficFile

if TYPE_CHECKING:
    from lorapool.router.picker.server import RunningPicker
    from lorapool.sources.setwatch import SetWatcher

log = logging.getLogger("lorapool.router")

# Below the idle timeout of uvicorn (5 s, what vLLM runs on), so the router never reuses a
# connection the engine is closing.
UPSTREAM_KEEPALIVE_S = 4.0
SHUTDOWN_GRACE_S = 10.0


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop to run on: uvloop's (about half the CPU per proxied request) or asyncio's."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if name == "asyncio":
        return asyncio.new_event_loop
    raise ValueError(f"--event-loop={name!r} is not uvloop or asyncio")


def _api_server(unavailable: str, kv: dict[str, str]) -> ApiServer | None:
    """The API server the router's own writes and reads go to, with the credentials its watches use
    (``KUBECONFIG``, else in cluster); None when there are none (logged as ``unavailable``)."""
    from kubernetes.config import ConfigException

    kubeconfig = os.environ.get("KUBECONFIG")
    try:
        return api_server(Path(kubeconfig) if kubeconfig else None)
    except (ValueError, OSError, ConfigException) as exc:
        log.warning(unavailable, extra={"kv": {**kv, "error": str(exc)}})
        return None


def publisher_for(settings: RouterSettings, counter: RequestCounter) -> Publisher | None:
    """The writer of the request counts on the router's own Pod, or None (no Pod, no credentials: logged)."""
    if settings.pod is None:
        log.info("Not publishing request counts on a Pod: no --pod and no POD_NAME/POD_NAMESPACE")
        return None
    pod = PodRef.parse(settings.pod)
    server = _api_server("Not publishing request counts on a Pod", {"pod": str(pod)})
    if server is None:
        return None
    log.info("Publishing request counts on Pod", extra={"kv": {"pod": str(pod), "window_s": counter.window_s}})
    return Publisher(server, pod, counter)


def _shared_books(
    settings: RouterSettings, scheduler: Scheduler, telemetry: Telemetry, publisher: Publisher | None
) -> SharedBooks | None:
    """The shared books' keeper (``--shared-state``), telling the Pod its state; None without the flag."""
    if settings.shared_state is None:
        return None
    books = SharedBooks(
        settings, scheduler, telemetry, on_state=publisher.set_books_state if publisher is not None else None
    )
    log.info(
        "Sharing the books",
        extra={"kv": {"store": redacted(settings.shared_state), "key": settings.shared_state_key, "router": books.me}},
    )
    return books


def adapter_set_watch(settings: RouterSettings, scheduler: Scheduler) -> SetWatcher | None:
    """The pool's adapter set, read and watched through the API (``--adapters-configmap``), telling the
    scheduler which adapters the pool has; None without the flag or credentials (logged): the router
    then knows adapters from the reports alone, as before."""
    if settings.adapters_configmap is None:
        return None
    from lorapool.sources.setwatch import SetRef, SetWatcher

    ref = SetRef.parse(settings.adapters_configmap)
    server = _api_server("Not reading the adapter set", {"configmap": str(ref)})
    if server is None:
        return None

    def changed() -> None:
        try:
            adapters = AdapterSet.from_json(watcher.snapshot or b"").adapters
        except ValueError as exc:  # a consistent set that does not parse: keep what we had, say why
            log.warning("Unreadable adapter set", extra={"kv": {"configmap": str(ref), "error": str(exc)[:300]}})
            return
        scheduler.set_desired(frozenset(a.name for a in adapters))

    watcher = SetWatcher(server, ref, changed)
    return watcher


def engine_auth_headers() -> dict[str, str]:
    """The engines' API key (spec.security.apiKeySecretRef, rendered as env VLLM_API_KEY) for every upstream call."""
    key = os.environ.get(ENGINE_API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


class _Discovery:
    """Which backends there are and what each one's sidecar reports: the router's two watches.

    The EndpointSlice watch (``--endpointslices``; else the static ``--backend`` list) sets the
    backends and polls the new ones at once; the Pod watch (``--report-pods``) folds each Pod's
    report into its backend. Apart from ``serve`` because both watches share this state and
    outlive the call that starts them."""

    def __init__(self, settings: RouterSettings, scheduler: Scheduler, poller: Poller) -> None:
        self.settings, self.scheduler, self.poller = settings, scheduler, poller
        self.loop = asyncio.get_running_loop()
        self.background: set[asyncio.Task[None]] = set()
        self.watch: EndpointSliceWatch | None = None
        self.reports: ListWatch[EnginePod] | None = None
        self.pods: dict[str, EnginePod] = {}
        self.static_pods = dict(settings.backend_pods)

    def fold_reports(self) -> None:
        """Give each backend its pod's report (by name from the slices or --backend-pod, else by IP)."""
        if self.settings.report_pods:
            pod_of = {**self.static_pods, **(self.watch.targets if self.watch is not None else {})}
            backends = (b.id for b in self.scheduler.backends())
            self.scheduler.set_reports(backend_reports(backends, self.pods, pod_of))

    def on_pods(self, facts: dict[str, EnginePod]) -> None:
        self.pods.clear()
        self.pods.update(facts)
        self.fold_reports()

    def on_change(self, urls: list[str]) -> None:
        added, removed = self.scheduler.set_backends(urls)
        self.fold_reports()
        if added or removed:
            log.info("Updated backends", extra={"added": added, "removed": removed})
            task = self.loop.create_task(self.poller.poll_all())
            self.background.add(task)
            task.add_done_callback(self.background.discard)

    async def start(self, pods_target: tuple[str, str] | None) -> None:
        """Start both watches and wait (up to 10 s each) for their first list."""
        if self.settings.endpointslices:
            namespace, service = parse_target(self.settings.endpointslices)
            self.watch = EndpointSliceWatch(
                namespace, service, self.on_change, self.loop, port_name=self.settings.port_name
            )
            self.watch.start()
            await asyncio.to_thread(self.watch.synced.wait, 10.0)
        else:
            self.scheduler.set_backends(self.settings.backends)
        if pods_target is not None:
            self.reports = pod_report_watch(*pods_target, self.on_pods, self.loop)
            self.reports.start()
            await asyncio.to_thread(self.reports.synced.wait, 10.0)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.reports is not None:
            self.reports.stop()


async def serve(settings: RouterSettings) -> None:
    """Run until a stop signal arrives."""
    first = read(Path(settings.policy_file), settings.policy_overrides()) if settings.policy_file else None
    loaded = first[1] if first is not None else from_flags(settings.policy_overrides())
    if not settings.backends and not settings.endpointslices:
        raise ValueError("give --backend URL (repeatable) or --endpointslices NAMESPACE/SERVICE")
    pods_target = parse_pods_target(settings.report_pods) if settings.report_pods else None
    telemetry = Telemetry(max_model_labels=settings.max_model_labels)
    scheduler = Scheduler(loaded.scheduling, settings, telemetry, knobs=loaded.knobs)
    policy = _policy_file(settings, first, loaded, scheduler, telemetry)
    traffic = TrafficFile(Path(settings.traffic_file), scheduler) if settings.traffic_file else None
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, headers=engine_auth_headers()
    ) as session:
        poller = Poller(scheduler, session, settings)
        discovery = _Discovery(settings, scheduler, poller)
        await discovery.start(pods_target)
        await poller.poll_all()
        counter = RequestCounter(settings.requests_window_s, time.monotonic())
        publisher = publisher_for(settings, counter)
        _publish_policy(publisher, policy, loaded)
        books = _shared_books(settings, scheduler, telemetry, publisher)
        if books is not None:  # the peers' books before the first request, when the store answers at once
            await books.resync()
        # The picker listens first, so an answering /livez means both doors are open.
        picker = await _start_picker(scheduler, telemetry, settings, counter)
        runner = await _start_site(build_app(scheduler, session, telemetry, settings, counter), settings)
        _log_started(settings, scheduler, policy.running if policy is not None else loaded)
        polling = loop.create_task(poller.run())
        rereading = loop.create_task(traffic.run(settings.poll_interval_s)) if traffic is not None else None
        rereading_policy = loop.create_task(policy.run(settings.poll_interval_s)) if policy is not None else None
        stop = asyncio.Event()
        publishing = loop.create_task(publisher.run(stop)) if publisher is not None else None
        adapter_set = adapter_set_watch(settings, scheduler)
        watching = loop.create_task(adapter_set.run(stop)) if adapter_set is not None else None
        sharing = loop.create_task(books.run(stop)) if books is not None else None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            log.info("Stopping router")
            await _cancelled(polling)
            for task in (rereading, rereading_policy):
                if task is not None:
                    await _cancelled(task)
            if publishing is not None:  # a write in flight is dropped: the counts are a rate, not a ledger
                await _cancelled(publishing)
            if watching is not None:
                await _cancelled(watching)
            if sharing is not None:  # it takes this router's entry out of the store as it stops
                await sharing
            discovery.stop()
            if picker is not None:
                await picker.stop()
            await runner.cleanup()


def _policy_file(
    settings: RouterSettings,
    first: tuple[bytes, Loaded] | None,
    loaded: Loaded,
    scheduler: Scheduler,
    telemetry: Telemetry,
) -> PolicyFile | None:
    """The live ``--policy-file`` (None without one: the flags' policy ``loaded``, its hash exported once)."""
    if first is None or settings.policy_file is None:
        telemetry.policy_running(loaded.hash, loaded.chain.name, "flags")
        return None
    policy = PolicyFile(
        Path(settings.policy_file), settings.policy_overrides(), scheduler.set_policy, telemetry, first=first
    )
    log.info("Read router policy", extra={"kv": {**summary(policy.running), "flags": list(policy.overrides.given)}})
    return policy


def _publish_policy(publisher: Publisher | None, policy: PolicyFile | None, loaded: Loaded) -> None:
    """Have the publisher write the policy state on the Pod now and after every reload."""
    if publisher is None:
        return
    if policy is None:
        publisher.set_policy_state(PolicyState(loaded.hash, source="flags"))
        return
    policy.on_state = publisher.set_policy_state
    publisher.set_policy_state(policy.state)


async def _start_picker(
    scheduler: Scheduler, telemetry: Telemetry, settings: RouterSettings, counter: RequestCounter
) -> RunningPicker | None:
    """The endpoint picker's gRPC listeners when ``--ext-proc-port`` is given (grpc imported only then)."""
    if settings.ext_proc_port is None:
        return None
    from lorapool.router.picker.server import start_picker

    return await start_picker(scheduler, telemetry, settings, counter, engine_auth_headers())


async def _start_site(app: web.Application, settings: RouterSettings) -> web.AppRunner:
    """Listen on --host/--port; in-flight requests get SHUTDOWN_GRACE_S at cleanup."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    await site.start()
    return runner


def _log_started(settings: RouterSettings, scheduler: Scheduler, policy: Loaded) -> None:
    backends = scheduler.backends()
    log.info(
        "Started router",
        extra={
            "address": f"http://{settings.host}:{settings.port}",
            "policy": policy.chain.name,
            "policy_hash": policy.hash,
            "prefix_weight": policy.chain.prefix_weight,
            "backends": len(backends),
            "backends_up": sum(s.up for s in backends),
            "reports": sum(st.report is not None for st in backends),
        },
    )


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
