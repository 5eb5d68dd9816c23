"""The adapter-sync sidecar's shell: watches the config and the engine, runs the actions
``core.diff`` decides, and serves /status, /healthz and /metrics (``http``).

``cli`` builds an ``Agent`` and runs it until SIGTERM. It does the I/O (calls the engine,
reads the files or, in a pod, the adapter set through the API (``sources.setwatch``), writes the Pod,
sleeps) and carries out what the pure modules decide: ``core``
(actions, /status), ``config`` (what a re-read of the config applies or refuses), ``drain``
(adapters placement moved away), ``health`` (engine health and restarts) and ``podreport`` (the
report on the Pod and its readiness condition). Each load or unload runs in its own asyncio
task through ``executor`` (download, the pool's checks, the engine call, and ``retry``'s
reading of a failure), so one slow or failing adapter never blocks the others.

Every outside call (engine, sources) has a timeout. Never crashes on bad input: a bad config
keeps the last good set, a bad adapter is Failed with a message that says what to fix, and it
is retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from lorapool.api.adapterset import AdapterSet
from lorapool.api.peft import parse_adapter_config
from lorapool.api.report import ReplicaPhase as Phase
from lorapool.errors import AdapterError, UnsafePathError
from lorapool.podstatus import PodRef, api_server
from lorapool.render.names import ENGINE_API_KEY_ENV
from lorapool.sidecar.config import ConfigFile, parse_config, parse_slot
from lorapool.sidecar.core import (
    AdapterState,
    ConfigView,
    EngineView,
    Load,
    Unload,
    diff,
    next_wake_s,
    status_document,
    summarize,
)
from lorapool.sidecar.drain import drain_after_config, still_draining
from lorapool.sidecar.engine import EngineClient, EngineError
from lorapool.sidecar.executor import Executor
from lorapool.sidecar.health import EngineHealth, HealthEvent, detect_restart, observe_health, stalled
from lorapool.sidecar.http import start_http
from lorapool.sidecar.keep import KeepBudget
from lorapool.sidecar.metrics import SidecarMetrics
from lorapool.sidecar.podreport import Readiness, next_readiness, pod_patch, replica_report
from lorapool.sidecar.reporter import Observer, Reporter
from lorapool.sidecar.retry import Backoff
from lorapool.sources import AdapterStore, Downloader, Limits, SourceOptions, redact_url
from lorapool.sources.layout import CONFIG_FILE
from lorapool.sources.setwatch import SetRef, SetWatcher
from lorapool.sources.verify import BaseShape

log = logging.getLogger("lorapool.sidecar")


@dataclass(frozen=True)
class Settings:
    """Sidecar settings; every duration in seconds."""

    config_path: Path | None  # a local adapters.json (dev, tests); None: read ``config_map`` through the API
    engine_url: str
    adapter_dir: Path
    host: str = "127.0.0.1"
    status_port: int = 8081
    resync_s: float = 30.0  # full reconcile at least this often, even without events
    config_poll_s: float = 2.0  # ConfigMap updates arrive by symlink swap; polling sees them
    health_poll_s: float = 2.0
    http_timeout_s: float = 10.0  # engine health/list/unload calls
    load_timeout_s: float = 120.0  # a load reads the weights from disk inside the engine
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    parallel_downloads: int = 4
    limits: Limits = field(default_factory=Limits)
    pvc_root: Path = Path("/mnt/pvc")
    pod: PodRef | None = None  # report on this Pod (lorapool.api.report); None: do not report
    report_kubeconfig: Path | None = None  # None: in-cluster credentials
    report_interval_s: float = 2.0  # at most one report write per this many seconds
    observe_window_s: float = 60.0  # the report's observations cover this long (one write per window)
    observe_sample_s: float = 2.0  # engine /metrics scraped this often for the observations
    # The downward-API file holding this pod's placement slot (docs/placement.md); None: no slot,
    # so the replica holds only adapters placed on every replica (all of them while placement is off).
    slot_path: Path | None = None
    # An adapter placement moved to other replicas stays loaded (and reported, so routable) this
    # long before it is unloaded: its new holders load it meanwhile, so no request meets a gap.
    drain_s: float = 30.0
    # Unloaded adapters' files kept for a place-back without a download (spec.sidecar.keepUnloaded).
    keep: KeepBudget = field(default_factory=KeepBudget)
    # The base model's shape every download is verified against (sources.verify); None: config and weights only.
    base_shape: BaseShape | None = None
    # The index ConfigMap of the pool's adapter set, read and watched through the API with the
    # report's credentials (``sources.setwatch``); the watch's timeout re-reads it at least this often.
    config_map: SetRef | None = None
    config_resync_s: float = 30.0


class Agent:
    def __init__(
        self, settings: Settings, *, rng: random.Random | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.rng = rng or random.Random()
        self.clock = clock
        self.metrics = SidecarMetrics()
        self.store = AdapterStore(settings.adapter_dir)
        self.downloader = Downloader(
            self.store,
            limits=settings.limits,
            parallel=settings.parallel_downloads,
            options=SourceOptions(pvc_root=settings.pvc_root),
            base_shape=settings.base_shape,
        )
        self.state: dict[str, AdapterState] = {}
        self.pool: AdapterSet | None = None
        self.rejected: dict[str, str] = {}
        self.slot: int | None = None  # this replica's placement slot, None until the operator assigns one
        self.draining: dict[str, float] = {}  # adapter moved to other replicas -> when it may be unloaded
        self.config_file = ConfigFile()  # what was applied or refused, and why
        self.config_loaded_at: float | None = None
        self.health = EngineHealth()
        self.restarts = 0
        self.backoff = Backoff(base_s=settings.backoff_base_s, cap_s=settings.backoff_cap_s)
        self.executor = Executor(
            self.state,
            self.store,
            self.downloader,
            self.metrics,
            engine=lambda: self.engine,
            pool=lambda: self.pool,
            clock=clock,
            rng=self.rng,
            backoff=self.backoff,
            keep=settings.keep,
        )
        self._adopted = False
        self._heartbeat = time.monotonic()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._kick = asyncio.Event()
        self._config_wake = asyncio.Event()  # read the config now: SIGHUP, or the watch saw a new set
        self._forget_config = False  # SIGHUP: re-apply even an unchanged set
        self.set_watcher: SetWatcher | None = None
        self._engine: EngineClient | None = None
        self.readiness = Readiness()  # the latch: first sync since the engine (re)started is over
        self.reporter: Reporter | None = None
        self.observer = Observer(
            settings.engine_url, window_s=settings.observe_window_s, sample_s=settings.observe_sample_s, clock=clock
        )

    @property
    def engine_healthy(self) -> bool:
        return self.health.healthy

    # ---- lifecycle -------------------------------------------------------------------

    def request_config_reload(self) -> None:
        """SIGHUP: re-read the config now."""
        self._forget_config = True
        self._config_wake.set()

    def kick(self) -> None:
        self._kick.set()

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        async with aiohttp.ClientSession() as session:
            self._engine = EngineClient(
                s.engine_url,
                session,
                timeout_s=s.http_timeout_s,
                load_timeout_s=s.load_timeout_s,
                api_key=os.environ.get(ENGINE_API_KEY_ENV) or None,
            )
            runner = await start_http(self, s.host, s.status_port)
            await asyncio.to_thread(self.store.reset_staging)
            set_watcher = self._make_set_watcher()
            self.read_config()
            watchers = [
                *([asyncio.create_task(set_watcher.run(stop))] if set_watcher is not None else []),
                asyncio.create_task(self._watch_config(stop)),
                asyncio.create_task(self._watch_health(stop)),
                asyncio.create_task(self._relay_stop(stop)),
            ]
            if (reporter := self._make_reporter()) is not None:
                watchers.append(asyncio.create_task(reporter.run(stop)))
                watchers.append(asyncio.create_task(self.observer.run(stop)))
            log.info(
                "Started sidecar",
                extra={
                    "kv": {
                        "engine": s.engine_url,
                        "config": str(s.config_map or s.config_path),
                        "adapterDir": str(s.adapter_dir),
                    }
                },
            )
            try:
                await self._reconcile_loop(stop)
            finally:
                for task in [*watchers, *self._tasks.values()]:
                    task.cancel()
                await asyncio.gather(*watchers, *self._tasks.values(), return_exceptions=True)
                await runner.cleanup()
                log.info("Stopped sidecar")

    def _make_set_watcher(self) -> SetWatcher | None:
        """The API reader of ``--adapters-configmap``; None in file mode, or without credentials (then
        the config is refused, saying why, and the sidecar serves nothing until it restarts with them)."""
        s = self.settings
        if s.config_map is None:
            return None
        try:
            server = api_server(s.report_kubeconfig)
        except (ValueError, OSError) as exc:
            self._config_failed(None, f"adapter set {s.config_map}: no API credentials ({exc})")
            return None
        self.set_watcher = SetWatcher(server, s.config_map, self._config_wake.set, resync_s=s.config_resync_s)
        return self.set_watcher

    def _make_reporter(self) -> Reporter | None:
        s = self.settings
        if s.pod is None:
            log.info("Not reporting adapters on a Pod: no --pod and no POD_NAME/POD_NAMESPACE")
            return None
        try:
            server = api_server(s.report_kubeconfig)
        except (ValueError, OSError) as exc:
            log.warning("Not reporting adapters on a Pod", extra={"kv": {"error": str(exc)}})
            return None

        def counted(ok: bool) -> None:
            self.metrics.report_writes.labels(result="ok" if ok else "error").inc()

        self.reporter = Reporter(server, s.pod, self.report_patch, min_interval_s=s.report_interval_s, on_write=counted)
        log.info("Reporting adapters on Pod", extra={"kv": {"pod": f"{s.pod.namespace}/{s.pod.name}"}})
        return self.reporter

    def report_patch(self) -> dict[str, Any]:
        """The Pod patch that says what the engine holds now: annotation plus readiness condition."""
        desired = {a.name: a for a in self.pool.adapters} if self.pool else {}
        wanted = set(desired) - set(self.rejected)
        self.readiness, condition = next_readiness(
            self.readiness,
            wanted,
            self.state,
            engine_healthy=self.engine_healthy,
            config_read=self.pool is not None,
            now=self.clock(),
        )
        report = replica_report(desired, self.state, self.rejected, engine_healthy=self.engine_healthy)
        report = replace(report, observations=self.observer.latest, engine_version=self.observer.version)
        return pod_patch(report, condition)

    async def _relay_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.kick()

    # ---- HTTP --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        document = status_document(
            EngineView(self.settings.engine_url, self.engine_healthy, self.restarts),
            ConfigView(
                str(self.settings.config_map or self.settings.config_path),
                self.config_file.error,
                self.config_loaded_at,
            ),
            self.pool,
            self.state,
            self.rejected,
        )
        document["slot"] = self.slot
        pod = self.settings.pod
        document["report"] = {
            "pod": f"{pod.namespace}/{pod.name}" if pod else None,
            "synced": self.readiness.latched,
            "writes": self.reporter.writes if self.reporter else 0,
            "error": self.reporter.last_error if self.reporter else None,
        }
        return document

    def stalled(self) -> str | None:
        return stalled(
            time.monotonic() - self._heartbeat,
            resync_s=self.settings.resync_s,
            health_poll_s=self.settings.health_poll_s,
        )

    def scrape(self) -> SidecarMetrics:
        self.metrics.set_phases(st.phase for st in self.state.values())
        self.metrics.engine_healthy.set(1 if self.engine_healthy else 0)
        return self.metrics

    # ---- config ------------------------------------------------------------------------

    def read_config(self) -> None:
        """Re-read the config; apply it if it changed and parses, else keep the last good set."""
        slot = self._read_slot()
        if slot != self.slot:
            log.info("Placement slot changed", extra={"kv": {"from": self.slot, "to": slot}})
            self.slot = slot
            self.config_file = self.config_file.forget()  # the share depends on the slot: re-apply
        if (raw := self._read_raw()) is None:
            return
        self.config_file, new = self.config_file.read(raw)
        if not new:
            return
        where = str(self.settings.config_map or self.settings.config_path)
        try:
            parsed = parse_config(raw, path=where)
        except ValueError as exc:
            self._config_failed(raw, str(exc))
            return
        share = parsed.adapters.share(self.slot)
        self.draining = drain_after_config(
            self.draining, self.pool, share, parsed.adapters, now=self.clock(), drain_s=self.settings.drain_s
        )
        self.pool, self.rejected = share, dict(parsed.rejected)
        self.config_file = self.config_file.apply(raw)
        self.config_loaded_at = self.clock()
        log.info(
            "Loaded config",
            extra={
                "kv": {
                    "pool": self.pool.pool,
                    "adapters": len(self.pool.adapters),
                    "listed": len(parsed.adapters.adapters),
                    "slot": self.slot,
                    "rejected": len(self.rejected),
                }
            },
        )
        for name, why in self.rejected.items():
            log.warning("Rejected adapter", extra={"kv": {"adapter": name, "error": why}})
        self.kick()

    def _read_raw(self) -> bytes | None:
        """The set's text: the file's, or the API reader's last consistent one. None: nothing to apply
        (a failure is recorded; the last good set keeps serving)."""
        s = self.settings
        if s.config_map is not None:
            watcher = self.set_watcher
            if watcher is not None and watcher.error is not None:
                self._config_failed(None, watcher.error)
                return None
            return watcher.snapshot if watcher is not None else None
        assert s.config_path is not None, "cli requires --config or --adapters-configmap"
        try:
            return s.config_path.read_bytes()
        except OSError as exc:
            self._config_failed(
                None, f"config {s.config_path}: cannot read it ({exc.strerror or exc}); check the ConfigMap mount"
            )
            return None

    def _read_slot(self) -> int | None:
        """The slot in the downward-API file; None while it is absent or empty (not assigned yet)."""
        if self.settings.slot_path is None:
            return None
        try:
            return parse_slot(self.settings.slot_path.read_text())
        except OSError:
            return None

    def _config_failed(self, raw: bytes | None, message: str) -> None:
        before = self.config_file
        self.config_file = before.refuse(raw, message, kept=len(self.pool.adapters) if self.pool else None)
        if self.config_file.error != before.error:
            log.warning("Refused config", extra={"kv": {"error": self.config_file.error}})
            self.metrics.config_errors.inc()

    async def _watch_config(self, stop: asyncio.Event) -> None:
        """Read the config when woken (SIGHUP, a new set from the API) and every ``config_poll_s``
        (the file's symlink swap, the slot file)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._config_wake.wait(), self.settings.config_poll_s)
            self._config_wake.clear()
            if self._forget_config:
                self._forget_config = False
                self.config_file = self.config_file.forget()  # SIGHUP forces a full re-apply
            self.read_config()

    # ---- engine ------------------------------------------------------------------------

    @property
    def engine(self) -> EngineClient:
        assert self._engine is not None, "run() creates the engine client"
        return self._engine

    async def _watch_health(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.health, event = observe_health(self.health, await self.engine.healthy())
            where = {"kv": {"engine": self.settings.engine_url}}
            if event in (HealthEvent.HEALTHY, HealthEvent.BACK):
                log.info("Engine became healthy", extra=where)
                if event is HealthEvent.BACK:
                    self.readiness = self.readiness.restarted()
                self.kick()
            elif event is HealthEvent.UNHEALTHY:
                log.warning("Engine became unhealthy", extra=where)
            elif event is HealthEvent.WAITING:
                log.info("Waiting for engine", extra=where)
            self.metrics.engine_healthy.set(1 if self.health.healthy else 0)
            await asyncio.sleep(self.settings.health_poll_s)

    def _adopt(self, actual: dict[str, str]) -> None:
        """After a sidecar restart: adapters the engine still holds from our store are ours."""
        for name, root in actual.items():
            try:
                origin = self.store.current(name)
            except UnsafePathError:
                continue
            if origin is None or root != str(self.store.path_of(origin.digest)):
                continue
            rank = None
            with contextlib.suppress(OSError, ValueError, AdapterError):
                rank = parse_adapter_config(json.loads((Path(root) / CONFIG_FILE).read_text())).rank
            self.state[name] = AdapterState(
                name,
                Phase.LOADED,
                origin.source,
                origin.revision,
                loaded=origin.identity,
                loaded_path=root,
                rank=rank,
                resolved=origin.resolved_revision,  # the digest it was fetched at survives the restart
            )
            log.info("Adopted adapter", extra={"kv": {"adapter": name, "path": root}})

    # ---- reconcile ---------------------------------------------------------------------

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._heartbeat = time.monotonic()
            if self.engine_healthy and self.pool is not None:
                try:
                    await self._reconcile()
                except Exception:  # never let one bad reconcile kill the loop
                    log.exception("Reconcile failed")
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self._next_wake())

    def _next_wake(self) -> float:
        return next_wake_s(self.state, self.draining, self.clock(), resync_s=self.settings.resync_s)

    async def _reconcile(self) -> None:
        assert self.pool is not None
        started = time.perf_counter()
        try:
            actual = await self.engine.adapters()
        except EngineError as exc:
            log.warning("Listing adapters failed", extra={"kv": {"error": str(exc)}})
            return
        if not self._adopted:
            await asyncio.to_thread(self._adopt, actual)
            self._adopted = True
        if (restart := detect_restart(actual, self.state, self.health)) is not None:
            self.restarts += 1
            self.metrics.engine_restarts.inc()
            log.warning("Detected engine restart", extra={"kv": {"cause": restart.cause, "reloading": restart.lost}})
            self.readiness = self.readiness.restarted()
        self.health = self.health.looked()
        desired = {a.name: a for a in self.pool.adapters}
        stored = await asyncio.to_thread(self.store.names)
        await asyncio.to_thread(self.executor.tidy)  # kept files age out even when nothing else happens
        now = self.clock()
        self.draining = still_draining(self.draining, now)
        hold = set(self.rejected) | set(self.draining)  # draining: still served here until its time is up
        actions = diff(desired, actual, self.state, now, stored=stored, hold=hold)
        for action in actions:
            if isinstance(action, Load):
                self._spawn(action.name, self.executor.load(action))
            elif isinstance(action, Unload):
                self._spawn(action.name, self.executor.unload(action))
        for name, adapter in desired.items():
            if name not in self.state:
                self.state[name] = AdapterState(name, source=redact_url(adapter.source), revision=adapter.revision)
        self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        self.metrics.set_phases(st.phase for st in self.state.values())
        counts = summarize(actions)
        if any(counts[k] for k in ("load", "reload", "unload")):
            log.info("Reconciled adapters", extra={"kv": counts})

    def _spawn(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        st = self.state.get(name) or AdapterState(name)
        self.state[name] = replace(st, busy=True)
        task = asyncio.create_task(work, name=f"adapter-{name}")
        self._tasks[name] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._tasks.get(name) is t:
                del self._tasks[name]
            if name in self.state:
                self.state[name] = replace(self.state[name], busy=False)
            self.kick()

        task.add_done_callback(done)
