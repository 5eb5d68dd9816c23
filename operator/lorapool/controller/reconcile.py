"""One level-based reconcile of a LoRAPool, in named steps: load -> read adapters -> decide -> apply
-> observe -> size -> report.

Called for every event on a pool, its LoRAAdapters, its Deployments and engine pods, and
by the drift resync; it never branches on which event it was. Each step here is I/O only;
every choice is made by the pure ``controller.decide`` and ``controller.status``.
When it runs is not its choice: ``controller.workqueue`` (over the pure ``controller.schedule``)
coalesces triggers, retries failures with backoff and resyncs; ``reconcile`` returns a ``Result``.

At catalogue scale (``controller.writes``): a pool's LoRAAdapters come from the watch-fed
``controller.index``, not a list per pass; their statuses are written first, in parallel under a
rate limit and only where they changed, then the pool's; a refused write (too large, a conflict,
forbidden) is the pool's ``WriteFailed`` condition and a Warning Event, and stops nothing else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes.client.exceptions import ApiException

from lorapool.api import mergepatch
from lorapool.api.clock import rfc3339
from lorapool.api.models import LoRAPool
from lorapool.api.pods import EnginePod, RouterPod, engine_pods, router_pods
from lorapool.api.status import AdapterPhase, ConditionType, LoRAAdapterStatus, LoRAPoolStatus
from lorapool.controller import decide, gateway, replan, signals, tuning, writes
from lorapool.controller.decide import Decision, Event
from lorapool.controller.index import AdapterIndex
from lorapool.controller.kube import Kube
from lorapool.controller.metadata import ConfigFetcher, fetch_adapter_metadata
from lorapool.controller.schedule import DONE, Result, RetryLater
from lorapool.controller.status import (
    NOWHERE,
    AdapterResult,
    Observed,
    adapter_object_status,
    invalid_spec_status,
    merge_conditions,
    pool_status,
    status_changed,
    unplaced_message,
)
from lorapool.controller.workqueue import bounded_map
from lorapool.controller.writes import AdapterEvent, TokenBucket, WriteFailure
from lorapool.plan.adapters import PoolAdapter, merge_adapters
from lorapool.plan.holders import assign_slots, pod_slots, slot_patches
from lorapool.render import manifests, names
from lorapool.render.manifests import RenderOptions
from lorapool.sources.config import ConfigCache

log = logging.getLogger("lorapool.operator")


@dataclass(frozen=True)
class Settings:
    """Operator settings; see `lorapool operator --help` for units and defaults."""

    render: RenderOptions
    metadata_timeout_s: float = 10.0
    metadata_concurrency: int = 8
    write_qps: float = writes.QPS  # per-adapter status writes, per operator process (controller.writes)
    write_burst: int = writes.BURST
    write_concurrency: int = writes.WRITE_CONCURRENCY


class PoolReconciler:
    """Reconciles one pool per ``reconcile`` call; ``controller.workqueue`` decides when, one run per pool at a time."""

    def __init__(
        self,
        kube: Kube,
        fetch: ConfigFetcher,
        settings: Settings,
        *,
        index: AdapterIndex | None = None,
        cache: ConfigCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        api_threads: Executor | None = None,
    ) -> None:
        self.kube = kube
        # The API calls' own threads (controller.app gives them): on the default executor, a restart's
        # 100 pools of API calls queued the source reads behind them past their 10 s timeout.
        self._api_threads = api_threads
        self.fetch = fetch
        self.settings = settings
        self.index = index  # None: list the namespace's LoRAAdapters each pass (no watch feeds an index)
        self.cache = cache  # sized by the catalogue: the adapters of every pool this process reconciles
        self._clock = clock
        self._bucket = TokenBucket(settings.write_qps, settings.write_burst, now=clock())
        self._bounds: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore, asyncio.Semaphore] | None = None
        self._catalogue: dict[tuple[str, str], int] = {}  # adapters per pool, for the cache's size
        self._placed: dict[tuple[str, str], Mapping[str, tuple[int, ...]] | None] = {}  # last holders per pool
        self._discovered: tuple[float, bool] | None = None  # (when, whether InferencePools are served)
        self._doors: dict[tuple[str, str], tuple[object, ...]] = {}  # door settings last pruned for, per pool
        self._shards: dict[tuple[str, str], int] = {}  # adapter-set shard slots last seen unused, per pool
        self._replans: dict[tuple[str, str], replan.Seen] = {}  # controller.replan: each catalogue's last change

    async def _io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._api_threads is None:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._api_threads, partial(fn, *args, **kwargs))

    async def reconcile(self, namespace: str, name: str) -> Result:
        """One pass, in steps; each step's name says what it does. The clock is read once, here:
        every step of the pass (placement, sizing, the conditions' transition times) sees one ``now``.
        Returns what the queue should do next: forget a deleted pool, run again after a sizing change."""
        now = time.time()
        # 1. load
        body = await self._io(self.kube.get, "LoRAPool", namespace, name)
        if body is None:
            await self._forget_deleted_pool(namespace, name, now)
            return Result(forget=True)  # deleted: ownerReferences let the garbage collector remove the children
        pool = decide.read_pool(body)
        if not isinstance(pool, LoRAPool):
            await self._report_pool(body, invalid_spec_status(pool, decide.generation(body)), [], now)
            return DONE
        # 2. read adapters (from the watch-fed index: one list per namespace per process)
        adapter_bodies = await self._read_adapters(namespace, name)
        objects = decide.pool_adapters(adapter_bodies, name)
        merged = merge_adapters(pool, objects.valid)
        self._fit_cache((namespace, name), len(merged.adapters))
        verdicts = await self._read_adapter_metadata(pool, merged.adapters)
        # 2b. read the pods placement reads
        pods, routers = await self._read_pods(pool)
        # 2c. (controller.replan) what the engines run, and when the catalogue last changed
        engine, changed_at = await self._replan_facts(body, adapter_bodies, merged.adapters, verdicts, now)
        # 3. decide (pure)
        decision = decide.decide(
            pool,
            merged,
            verdicts,
            objects.invalid,
            self.settings.render,
            pods=pods,
            routers=routers,
            status=body.get("status"),
            now=now,
            tuned=tuning.tuned_max_loras(pool, body),
            engine=engine,
            changed_at=changed_at,
        )
        # 4. apply (the InferencePool only while the cluster serves its API: controller.gateway)
        served = await self._serves_inference_pools(now)
        failures = await self._apply(pool, gateway.without_unserved(decision.objects, served))
        await self._prune_door(pool, served)
        if not failures:  # the index names only the shards just applied: the rest may go
            await self._prune_shards(pool, decision.objects)
        await self._assign_slots(pool, pods)
        self._export_signals(pool, pods, decision)
        # 5. observe
        observed, pods = await self._observe(pool, body, decision, pods, served)
        # 6. size (pure), 7. report: each LoRAAdapter's own status first, then the pool's (which
        # says which writes failed): a pool status the API server refuses stops no adapter's.
        status, events = self._size(pool, body, decision, observed, pods, now)
        failures += await self._write_adapter_statuses(pool, body, adapter_bodies, observed, now)
        failures += await self._report_pool(body, status, failures, now)
        await self._post(body, events)
        await self._post(body, [decision.restart_event] if decision.restart_event else [])  # controller.replan
        if failures:
            raise RetryLater(f"{len(failures)} write(s) failed; see the pool's WriteFailed condition")
        # A change of status.sizing changes the plan: render it now, not at the next resync.
        return self._next(events, decision)

    async def _read_adapters(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        """The LoRAAdapters that may belong to ``pool``: from the index once the namespace was listed once."""
        if self.index is None:
            return list(await self._io(self.kube.list, "LoRAAdapter", namespace))
        if not self.index.primed(namespace):
            listed = await self._io(self.kube.list, "LoRAAdapter", namespace, None, "0")
            if not self.index.primed(namespace):  # another pool of the namespace may have listed meanwhile
                self.index.prime(namespace, listed)
        return self.index.of_pool(namespace, pool)

    def _fit_cache(self, key: tuple[str, str], adapters: int | None) -> None:
        """Size the config cache by the catalogue: every pool's adapters as last reconciled."""
        if adapters is None:
            self._catalogue.pop(key, None)
        else:
            self._catalogue[key] = adapters
        if self.cache is not None:
            self.cache.fit(sum(self._catalogue.values()))

    async def _forget_deleted_pool(self, namespace: str, name: str, now: float) -> None:
        """The pool is gone: drop what this process remembers of it and tell its LoRAAdapters."""
        self._placed.pop((namespace, name), None)
        self._doors.pop((namespace, name), None)
        self._shards.pop((namespace, name), None)
        self._replans.pop((namespace, name), None)
        self._fit_cache((namespace, name), None)
        signals.forget(namespace, name)
        await self._write_orphan_statuses(namespace, name, now)

    async def _read_pods(self, pool: LoRAPool) -> tuple[tuple[EnginePod, ...], tuple[RouterPod, ...]]:
        """The engine pods (their slots and their sidecars' load reports, decoded once here) and the
        router pods (their request counts per adapter, decoded once here too): both feed placement. Router pods trigger
        nothing (app.py watches engine pods only): their counts are read here, at the next
        reconcile or the resync."""
        namespace, name = pool.metadata.namespace, pool.metadata.name
        pods = await self._io(self.kube.list, "Pod", namespace, names.selector_string(name, "engine"))
        routers = await self._io(self.kube.list, "Pod", namespace, names.selector_string(name, "router"))
        return engine_pods(pods), router_pods(routers)

    @staticmethod
    def _size(
        pool: LoRAPool,
        body: Mapping[str, Any],
        decision: Decision,
        observed: Observed,
        pods: Sequence[EnginePod],
        now: float,
    ) -> tuple[LoRAPoolStatus, tuple[Event, ...]]:
        """The pool's status with status.recommendation from the sidecars' reports and the opt-in
        loop's change (``controller.tuning``), and the Events of that change."""
        sized = tuning.size(
            pool,
            decision.plan,
            tuning.current_sizing(body),
            tuning.pod_windows(pods, now),
            now,
            serving=tuning.serving_pods(pods),
        )
        status = pool_status(observed).model_copy(
            update={"recommendation": sized.recommendation, "sizing": sized.sizing}
        )
        if decision.restart is not None:  # controller.replan: EngineRestartPending
            status = status.model_copy(update={"conditions": [*status.conditions, decision.restart]})
        return status, sized.events

    @staticmethod
    def _next(events: Sequence[Event], decision: Decision) -> Result:
        """At once after a sizing change; controller.replan: a held restart again when its settle window
        ends (announced: at once); else done."""
        if events:
            return Result(requeue=True)
        return Result(requeue=True, after_s=decision.after_s) if decision.after_s is not None else DONE

    async def _replan_facts(
        self,
        body: Mapping[str, Any],
        adapter_bodies: Sequence[Mapping[str, Any]],
        adapters: Sequence[PoolAdapter],
        verdicts: Sequence[AdapterResult],
        now: float,
    ) -> tuple[Mapping[str, Any] | None, float | None]:
        """controller.replan's facts: the engine Deployment as it runs, and when the pool's catalogue
        (servable names and ranks) last changed, remembered per pool (``replan.catalogue_seen``); on
        first sight, from the objects' metadata."""
        meta = body["metadata"]
        engine = await self._io(self.kube.get, "Deployment", meta["namespace"], names.engine(meta["name"]))
        key = (meta["namespace"], meta["name"])
        ranks = [
            (a.spec.name, v.rank) for a, v in zip(adapters, verdicts, strict=True) if v.phase != AdapterPhase.FAILED
        ]
        stamps = replan.metadata_stamps(body, [b for b in adapter_bodies if decide.points_at(b, meta["name"])])
        self._replans[key] = replan.catalogue_seen(self._replans.get(key), ranks, stamps, now)
        return engine, self._replans[key].changed_at

    def _limits(self) -> tuple[asyncio.Semaphore, asyncio.Semaphore]:
        """The operator's bounds on source reads and on status writes, for all pools together, taken
        before a read's timeout starts. Per pool, 100 pools after a restart were 800 reads queued for
        the 6 threads the API calls use too, and the 10 s timeouts ran out in that queue (5,072
        adapters marked unreadable, every pool Degraded for a while). One pair per event loop."""
        loop = asyncio.get_running_loop()
        if self._bounds is None or self._bounds[0] is not loop:
            reads, writes_ = self.settings.metadata_concurrency, self.settings.write_concurrency
            self._bounds = (loop, asyncio.Semaphore(reads), asyncio.Semaphore(writes_))
        return self._bounds[1], self._bounds[2]

    async def _read_adapter_metadata(self, pool: LoRAPool, adapters: Sequence[PoolAdapter]) -> list[AdapterResult]:
        """Each adapter's verdict from its adapter_config.json, read with bounded concurrency and a timeout."""
        base_model = pool.spec.base_model.name

        async def one(adapter: PoolAdapter) -> AdapterResult:
            async with self._limits()[0]:
                fetched = await fetch_adapter_metadata(pool, adapter, self.fetch, self.settings.metadata_timeout_s)
            return decide.judge_adapter(adapter, base_model, fetched)

        return await bounded_map(one, adapters, self.settings.metadata_concurrency)

    async def _apply(self, pool: LoRAPool, objects: Sequence[dict[str, Any]]) -> list[WriteFailure]:
        """Apply the rendered objects in order; the first one refused stops the rest (a later one may
        depend on it: the adapter set's index names the shards before it) and is returned, not raised."""
        for obj in objects:
            try:
                written = await self._io(self.kube.apply, obj)
            except ApiException as exc:
                return [_failure("apply", obj["kind"], obj["metadata"]["name"], exc)]
            if written:
                log.info(
                    "Applied %s",
                    obj["kind"],
                    extra={
                        "pool": f"{pool.metadata.namespace}/{pool.metadata.name}",
                        "object": obj["metadata"]["name"],
                    },
                )
        return []

    def _export_signals(self, pool: LoRAPool, pods: Sequence[EnginePod], decision: Decision) -> None:
        """The pool's autoscaling signals, and the loads a placement change asked for (per scale event)."""
        namespace, name = pool.metadata.namespace, pool.metadata.name
        signals.export(namespace, name, signals.pool_signals(pool, pods, decision.placement))
        if decision.placement is None:
            return
        holders = decision.placement.holders
        loads = signals.count_loads(namespace, name, self._placed.get((namespace, name)), holders)
        if loads:
            log.info("Moved adapters", extra={"pool": f"{namespace}/{name}", "loads": loads})
        self._placed[(namespace, name)] = holders

    async def _assign_slots(self, pool: LoRAPool, pods: Sequence[EnginePod]) -> None:
        """Give each engine pod its stable placement slot (and the deletion cost that keeps scale-downs
        at the top slot); written only where a pod's annotations are stale."""
        current = pod_slots(pods)
        for pod, patch in slot_patches(current, assign_slots(current, pool.spec.replicas)).items():
            if await self._io(self.kube.annotate, "Pod", pool.metadata.namespace, pod, patch) is False:
                continue  # deleted since it was listed (a rollout): the next pass sees the pods as they are
            log.info(
                "Annotated Pod",
                extra={
                    "pool": f"{pool.metadata.namespace}/{pool.metadata.name}",
                    "object": pod,
                    "slot": patch[names.SLOT_ANNOTATION],
                },
            )

    async def _prune_door(self, pool: LoRAPool, served: bool) -> None:
        """Delete the door objects the spec no longer renders (``gateway.door_leftovers``), if ours.

        Looked for once per pool per operator process and again when its door settings change (or the
        InferencePool API appears), not on every pass: a resync of an unchanged pool reads nothing more."""
        namespace = pool.metadata.namespace
        key, doors = (namespace, pool.metadata.name), tuple(gateway.door_leftovers(pool, served))
        if self._doors.get(key) == doors:  # the same leftovers (door, sharedState, one router) as last time
            return
        for kind, name in doors:
            await self._delete_ours(pool, kind, name)
        self._doors[key] = doors

    async def _prune_shards(self, pool: LoRAPool, objects: Sequence[dict[str, Any]]) -> None:
        """Delete the adapter-set shards a shrunk set no longer renders, if ours. Looked for when the
        number of unused slots changes, not on every pass; after the index, which no longer names them."""
        namespace, name = pool.metadata.namespace, pool.metadata.name
        leftovers = set(manifests.shard_leftovers(name, objects))
        if self._shards.get((namespace, name)) == len(leftovers):
            return
        # One list of the pool's adapter-set ConfigMaps, not a GET per unused slot (32 per pool).
        live = await self._io(self.kube.list, "ConfigMap", namespace, names.selector_string(name, "adapters"))
        for cm in live:
            if cm["metadata"]["name"] in leftovers and gateway.controlled_by(cm, pool.metadata.uid):
                await self._io(self.kube.delete, "ConfigMap", namespace, cm["metadata"]["name"], cm["metadata"]["uid"])
                log.info("Deleted ConfigMap", extra={"pool": f"{namespace}/{name}", "object": cm["metadata"]["name"]})
        self._shards[(namespace, name)] = len(leftovers)

    async def _delete_ours(self, pool: LoRAPool, kind: str, name: str) -> None:
        namespace = pool.metadata.namespace
        live = await self._io(self.kube.get, kind, namespace, name)
        if live is not None and gateway.controlled_by(live, pool.metadata.uid):
            await self._io(self.kube.delete, kind, namespace, name, live["metadata"]["uid"])
            log.info("Deleted %s", kind, extra={"pool": f"{namespace}/{pool.metadata.name}", "object": name})

    async def _serves_inference_pools(self, now: float) -> bool:
        """Discovery of the InferencePool API, trusted for ``gateway.DISCOVERY_TTL_S``: one read per
        operator per TTL, not per pool, and a CRD installed later is seen without a restart."""
        if self._discovered is None or now - self._discovered[0] >= gateway.DISCOVERY_TTL_S:
            served = await self._io(self.kube.serves, gateway.GROUP_VERSION, gateway.PLURAL)
            self._discovered = (now, served)
        return self._discovered[1]

    async def _observe(
        self, pool: LoRAPool, body: Mapping[str, Any], decision: Decision, earlier: Sequence[EnginePod], served: bool
    ) -> tuple[Observed, tuple[EnginePod, ...]]:
        """The children as the API server has them after the apply; engine pods unchanged since
        ``earlier`` (the same resourceVersion) are not decoded again."""
        namespace, name = pool.metadata.namespace, pool.metadata.name
        engine = await self._io(self.kube.get, "Deployment", namespace, names.engine(name))
        router = await self._io(self.kube.get, "Deployment", namespace, names.router(name))
        listed = await self._io(self.kube.list, "Pod", namespace, names.selector_string(name, "engine"))
        pods = engine_pods(listed, known=earlier)
        door = await self._observe_gateway(pool, router, served) if pool.spec.router.picker else None
        return decide.observe(pool, body, decision, engine, router, pods, door), pods

    async def _observe_gateway(
        self, pool: LoRAPool, router: Mapping[str, Any] | None, served: bool
    ) -> gateway.GatewayObserved:
        namespace, name = pool.metadata.namespace, names.inference_pool(pool.metadata.name)
        live = await self._io(self.kube.get, gateway.INFERENCE_POOL_KIND, namespace, name) if served else None
        ready = int(((router or {}).get("status") or {}).get("readyReplicas") or 0) > 0
        return gateway.GatewayObserved(namespace, name, served, live, ready)

    async def _report_pool(
        self, raw: Mapping[str, Any], status: LoRAPoolStatus, failures: Sequence[WriteFailure], now: float
    ) -> list[WriteFailure]:
        """Write the pool's status with ``WriteFailed`` while writes fail. If the API server refuses the
        status itself, write the conditions alone (a small patch) saying so. Returns that refusal, if any."""
        failed = writes.write_failed_condition(failures, status.observed_generation)
        own = await self._write_status(raw, _with_condition(status, failed), now)
        if own is not None:
            failed = writes.write_failed_condition([*failures, own], status.observed_generation)
            small = LoRAPoolStatus(conditions=_with_condition(status, failed).conditions)
            if (again := await self._write_status(raw, small, now)) is not None:
                log.warning("Cannot write the status of LoRAPool: %s", again.detail[:300], extra=_pool_key(raw))
        if failed is not None and _changed_condition(raw, failed):
            await self._post(raw, [Event(failed.reason, failed.message, "Warning")])
            log.warning("Writes failed: %s", failed.message, extra=_pool_key(raw))
        return [own] if own is not None else []

    def _stamped(
        self, raw: Mapping[str, Any], status: LoRAPoolStatus | LoRAAdapterStatus, now: float
    ) -> tuple[Any, dict[str, Any] | None]:
        """The status with its conditions merged into the current ones (a condition keeps its
        lastTransitionTime until its status changes), and its patch, None when nothing would change."""
        current = raw.get("status") or {}
        stamped = status.model_copy(
            update={"conditions": merge_conditions(current.get("conditions") or [], status.conditions, rfc3339(now))}
        )
        patch = mergepatch.patch_of(current, stamped.to_patch())  # a key gone from a nested map is sent as null
        return stamped, patch if status_changed(current, patch) else None

    async def _write_status(self, raw: Mapping[str, Any], status: LoRAPoolStatus, now: float) -> WriteFailure | None:
        """Write a LoRAPool's status when it changed, and post the Events of the change."""
        _, patch = self._stamped(raw, status, now)
        if patch is None:
            return None
        meta = raw["metadata"]
        try:
            await self._io(self.kube.patch_status, "LoRAPool", meta["namespace"], meta["name"], patch)
        except ApiException as exc:
            return _failure("status", "LoRAPool", meta["name"], exc)
        pool_events = decide.pool_events(raw.get("status") or {}, patch)
        folded = writes.fold_repeats([(e.reason, e.message, e.type) for e in pool_events])
        await self._post(raw, [Event(e.reason, e.message, e.type) for e in folded])
        return None

    async def _write_adapter_status(
        self, raw: Mapping[str, Any], status: LoRAAdapterStatus, now: float
    ) -> tuple[WriteFailure | None, list[AdapterEvent]]:
        """One LoRAAdapter's status, if it changed since the index last saw it, under the rate limit;
        an object gone meanwhile (404) is nothing to report. Returns its failure or its Events."""
        stamped, patch = self._stamped(raw, status, now)
        if patch is None:
            return None, []
        before = raw.get("status") or {}  # record_status below replaces it on the index's object, which is raw
        meta = raw["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        async with self._limits()[1]:
            if (delay := self._bucket.reserve(self._clock())) > 0:
                await asyncio.sleep(delay)
            try:
                await self._io(self.kube.patch_status, "LoRAAdapter", namespace, name, patch)
            except ApiException as exc:
                return (None if exc.status == 404 else _failure("status", "LoRAAdapter", name, exc)), []
        if self.index is not None:
            self.index.record_status(namespace, name, patch)
        events = decide.adapter_events(before, stamped)
        return None, [AdapterEvent(name, e.reason, e.message, e.type) for e in events]

    async def _write_adapter_statuses_of(
        self, items: Sequence[tuple[Mapping[str, Any], Callable[[], LoRAAdapterStatus]]], now: float
    ) -> tuple[list[WriteFailure], list[AdapterEvent]]:
        """Many LoRAAdapters' statuses, ``write_concurrency`` at a time; their failures and Events. Each
        status is made by its writer (``items`` hold how to make it): 10,000 status models made up front
        were most of a reconcile's peak memory."""

        async def one(
            item: tuple[Mapping[str, Any], Callable[[], LoRAAdapterStatus]],
        ) -> tuple[WriteFailure | None, list[AdapterEvent]]:
            return await self._write_adapter_status(item[0], item[1](), now)

        done = await bounded_map(one, items, self.settings.write_concurrency)
        return [f for f, _ in done if f is not None], [e for _, events in done for e in events]

    async def _post(self, involved: Mapping[str, Any], events: Sequence[Event]) -> None:
        """Post Events; one refused (a namespace being deleted: 403) is logged in a line, never raised."""
        for event in events:
            try:
                await self._io(self.kube.event, involved, reason=event.reason, message=event.message, type_=event.type)
            except ApiException as exc:
                log.warning(
                    "Cannot post Event %s: %s %s", event.reason, exc.status, exc.reason, extra=_pool_key(involved)
                )

    async def _post_adapter_events(
        self, pool_raw: Mapping[str, Any], bodies: Mapping[str, Mapping[str, Any]], events: Sequence[AdapterEvent]
    ) -> None:
        """Few transitions: on each LoRAAdapter; many: one Event per reason on the pool (``writes.aggregate``)."""
        single, pooled = writes.aggregate(events)
        for event in single:
            await self._post(bodies[event.adapter], [Event(event.reason, event.message, event.type)])
        await self._post(pool_raw, [Event(e.reason, e.message, e.type) for e in pooled])

    async def _write_orphan_statuses(self, namespace: str, name: str, now: float) -> None:
        """Say on each LoRAAdapter whose spec.poolRef names this missing pool that it does not exist; not
        on those being deleted (a namespace being deleted takes the pool and its adapters together)."""
        bodies = await self._read_adapters(namespace, name)
        items = [
            (raw, partial(adapter_object_status, name, raw["metadata"].get("generation"), verdict))
            for raw in bodies
            if decide.points_at(raw, name) and not raw["metadata"].get("deletionTimestamp")
            for verdict in [decide.missing_pool(namespace, name, raw["metadata"]["name"])]
        ]
        failures, events = await self._write_adapter_statuses_of(items, now)
        single, pooled = writes.aggregate(events)
        by_name = {raw["metadata"]["name"]: raw for raw, _ in items}
        for event in single:
            await self._post(by_name[event.adapter], [Event(event.reason, event.message, event.type)])
        if failures or pooled:
            log.info(
                "LoRAPool is gone: %d adapter status(es) written, %d refused (%s)",
                len(items) - len(failures),
                len(failures),
                ", ".join(sorted({f.reason for f in failures})) or "none",
                extra={"pool": f"{namespace}/{name}"},
            )

    async def _write_adapter_statuses(
        self,
        pool: LoRAPool,
        pool_raw: Mapping[str, Any],
        bodies: Sequence[Mapping[str, Any]],
        observed: Observed,
        now: float,
    ) -> list[WriteFailure]:
        """Every LoRAAdapter of the pool (not being deleted) gets its status; returns the refused writes."""
        by_name = {r.name: r for r in observed.adapters if r.origin == "LoRAAdapter"}
        items = []
        for raw in bodies:
            meta = raw["metadata"]
            r = by_name.get(meta["name"])
            if r is None or not decide.points_at(raw, pool.metadata.name) or meta.get("deletionTimestamp"):
                continue
            presence = observed.of(r.name) if r.phase != AdapterPhase.CONFLICT else NOWHERE
            make_status = partial(
                adapter_object_status,
                pool.metadata.name,
                meta.get("generation"),
                r,
                presence,
                routable=observed.router_ready,
                blocked="; ".join(observed.plan_errors),
                placed=observed.placement.placed(r.name, pool.spec.replicas)
                if observed.placement and r.phase not in (AdapterPhase.FAILED, AdapterPhase.CONFLICT)
                else None,
                no_room=unplaced_message(observed.placement, r.name),
            )
            items.append((raw, make_status))
        failures, events = await self._write_adapter_statuses_of(items, now)
        await self._post_adapter_events(pool_raw, {raw["metadata"]["name"]: raw for raw, _ in items}, events)
        return failures


def _failure(verb: str, kind: str, name: str, exc: ApiException) -> WriteFailure:
    """A refused write as plain data: the API server's message, from its Status body when it sent one."""
    detail = str(exc.reason or "")
    try:
        detail = json.loads(exc.body or "{}").get("message") or detail
    except (ValueError, AttributeError):
        detail = (str(exc.body or "") or detail)[:500]
    return WriteFailure(verb, kind, name, int(exc.status or 0), detail)


def _with_condition(status: LoRAPoolStatus, extra: Any) -> LoRAPoolStatus:
    """``status`` with ``extra`` (a condition, or None) added: the WriteFailed one while writes fail."""
    if extra is None:
        return status
    kept = [c for c in status.conditions if c.type != ConditionType.WRITE_FAILED]
    return status.model_copy(update={"conditions": [*kept, extra]})


def _changed_condition(raw: Mapping[str, Any], new: Any) -> bool:
    """True when the stored condition of that type has another status, reason or message (an Event is due)."""
    conditions = (raw.get("status") or {}).get("conditions") or []
    stored: Mapping[str, Any] = next((c for c in conditions if c.get("type") == new.type), {})
    return (stored.get("status"), stored.get("reason"), stored.get("message")) != (new.status, new.reason, new.message)


def _pool_key(raw: Mapping[str, Any]) -> dict[str, str]:
    meta = raw.get("metadata") or {}
    return {"pool": f"{meta.get('namespace')}/{meta.get('name')}"}
