"""One level-based reconcile of a LoRAPool, in named steps: load -> read adapters -> decide -> apply
-> observe -> size -> report.

Called for every event on a pool, its LoRAAdapters, its Deployments and engine pods, and
by the drift resync; it never branches on which event it was. Each step here is I/O only;
every choice is made by the pure ``controller.decide`` and ``controller.status``.
When it runs is not its choice: ``controller.workqueue`` (over the pure ``controller.schedule``)
coalesces triggers, retries failures with backoff and resyncs; ``reconcile`` returns a ``Result``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lorapool.api.clock import rfc3339
from lorapool.api.models import LoRAPool
from lorapool.api.pods import EnginePod, RouterPod, engine_pods, router_pods
from lorapool.api.status import AdapterPhase, LoRAAdapterStatus, LoRAPoolStatus
from lorapool.controller import decide, gateway, signals, tuning
from lorapool.controller.decide import Decision, Event, Fetched
from lorapool.controller.kube import Kube
from lorapool.controller.schedule import DONE, Result
from lorapool.controller.status import (
    NOWHERE,
    AdapterResult,
    Observed,
    adapter_object_status,
    invalid_spec_status,
    merge_conditions,
    pool_status,
    status_changed,
)
from lorapool.errors import LoRAPoolError, SourceError
from lorapool.plan.adapters import PoolAdapter, merge_adapters
from lorapool.plan.holders import assign_slots, pod_slots, slot_patches
from lorapool.render import names
from lorapool.render.manifests import RenderOptions

log = logging.getLogger("lorapool.operator")

ConfigFetcher = Callable[[str, str | None], Any]  # async (source, revision) -> adapter_config dict


@dataclass(frozen=True)
class Settings:
    """Operator settings; see `lorapool operator --help` for units and defaults."""

    render: RenderOptions
    metadata_timeout_s: float = 10.0
    metadata_concurrency: int = 8


async def fetch_adapter_metadata(adapter: PoolAdapter, fetch: ConfigFetcher, timeout_s: float) -> Fetched:
    """Read one adapter's adapter_config.json; a source that fails is a fact for ``decide``, never a crash."""
    spec = adapter.spec
    try:
        return Fetched(config=await asyncio.wait_for(fetch(spec.source, spec.revision), timeout_s))
    except (SourceError, TimeoutError, OSError) as exc:
        return Fetched(unreadable=str(exc) or f"timed out after {timeout_s:g}s")
    except LoRAPoolError as exc:
        return Fetched(refused=str(exc))


class PoolReconciler:
    """Reconciles one pool per ``reconcile`` call; ``controller.workqueue`` decides when, one run per pool at a time."""

    def __init__(self, kube: Kube, fetch: ConfigFetcher, settings: Settings) -> None:
        self.kube = kube
        self.fetch = fetch
        self.settings = settings
        self._placed: dict[tuple[str, str], Mapping[str, tuple[int, ...]] | None] = {}  # last holders per pool
        self._discovered: tuple[float, bool] | None = None  # (when, whether InferencePools are served)
        self._doors: dict[tuple[str, str], tuple[object, ...]] = {}  # door settings last pruned for, per pool

    async def _io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

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
            await self._write_status(body, invalid_spec_status(pool, decide.generation(body)), now)
            return DONE
        # 2. read adapters
        adapter_bodies = await self._io(self.kube.list, "LoRAAdapter", namespace)
        objects = decide.pool_adapters(adapter_bodies, name)
        merged = merge_adapters(pool, objects.valid)
        verdicts = await self._read_adapter_metadata(pool, merged.adapters)
        # 2b. read the pods placement reads
        pods, routers = await self._read_pods(pool)
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
        )
        # 4. apply (the InferencePool only while the cluster serves its API: controller.gateway)
        served = await self._serves_inference_pools(now)
        await self._apply(pool, gateway.without_unserved(decision.objects, served))
        await self._prune_door(pool, served)
        await self._assign_slots(pool, pods)
        self._export_signals(pool, pods, decision)
        # 5. observe
        observed, pods = await self._observe(pool, body, decision, pods, served)
        # 6. size (pure), 7. report
        status, events = self._size(pool, body, decision, observed, pods, now)
        await self._write_status(body, status, now)
        await self._post(body, events)
        await self._write_adapter_statuses(pool, adapter_bodies, observed, now)
        # A change of status.sizing changes the plan: render it now, not at the next resync.
        return Result(requeue=True) if events else DONE

    async def _forget_deleted_pool(self, namespace: str, name: str, now: float) -> None:
        """The pool is gone: drop what this process remembers of it and tell its LoRAAdapters."""
        self._placed.pop((namespace, name), None)
        self._doors.pop((namespace, name), None)
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
        return status, sized.events

    async def _read_adapter_metadata(self, pool: LoRAPool, adapters: Sequence[PoolAdapter]) -> list[AdapterResult]:
        """Each adapter's verdict from its adapter_config.json, read with bounded concurrency and a timeout."""
        sem = asyncio.Semaphore(self.settings.metadata_concurrency)
        base_model = pool.spec.base_model.name

        async def one(adapter: PoolAdapter) -> AdapterResult:
            async with sem:
                fetched = await fetch_adapter_metadata(adapter, self.fetch, self.settings.metadata_timeout_s)
            return decide.judge_adapter(adapter, base_model, fetched)

        return list(await asyncio.gather(*(one(a) for a in adapters)))

    async def _apply(self, pool: LoRAPool, objects: Sequence[dict[str, Any]]) -> None:
        for obj in objects:
            if await self._io(self.kube.apply, obj):
                log.info(
                    "Applied %s",
                    obj["kind"],
                    extra={
                        "pool": f"{pool.metadata.namespace}/{pool.metadata.name}",
                        "object": obj["metadata"]["name"],
                    },
                )

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
            await self._io(self.kube.annotate, "Pod", pool.metadata.namespace, pod, patch)
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
        key, doors = (
            (namespace, pool.metadata.name),
            (pool.spec.router.front_door, pool.spec.security.network_policy, served),
        )
        if self._doors.get(key) == doors:
            return
        for kind, name in gateway.door_leftovers(pool, served):
            live = await self._io(self.kube.get, kind, namespace, name)
            if live is not None and gateway.controlled_by(live, pool.metadata.uid):
                await self._io(self.kube.delete, kind, namespace, name, live["metadata"]["uid"])
                log.info("Deleted %s", kind, extra={"pool": f"{namespace}/{pool.metadata.name}", "object": name})
        self._doors[key] = doors

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

    async def _write_status(
        self, raw: Mapping[str, Any], status: LoRAPoolStatus | LoRAAdapterStatus, now: float
    ) -> None:
        """Write a LoRAPool's or LoRAAdapter's status when it changed, its conditions merged into the
        current ones (a condition keeps its lastTransitionTime until its status changes), and post
        the Events of the change."""
        current = raw.get("status") or {}
        stamped = status.model_copy(
            update={"conditions": merge_conditions(current.get("conditions") or [], status.conditions, rfc3339(now))}
        )
        patch = stamped.to_patch()
        if not status_changed(current, patch):
            return
        if isinstance(stamped, LoRAPoolStatus):
            kind, events = "LoRAPool", decide.pool_events(current, patch)
        else:
            kind, events = "LoRAAdapter", decide.adapter_events(current, stamped)
        meta = raw["metadata"]
        await self._io(self.kube.patch_status, kind, meta["namespace"], meta["name"], patch)
        await self._post(raw, events)

    async def _post(self, involved: Mapping[str, Any], events: Sequence[Event]) -> None:
        for event in events:
            await self._io(self.kube.event, involved, reason=event.reason, message=event.message, type_=event.type)

    async def _write_orphan_statuses(self, namespace: str, name: str, now: float) -> None:
        """Say on each LoRAAdapter whose spec.poolRef names this missing pool that it does not exist."""
        for raw in await self._io(self.kube.list, "LoRAAdapter", namespace):
            if decide.points_at(raw, name):
                verdict = decide.missing_pool(namespace, name, raw["metadata"]["name"])
                await self._write_status(
                    raw, adapter_object_status(name, raw["metadata"].get("generation"), verdict), now
                )

    async def _write_adapter_statuses(
        self, pool: LoRAPool, bodies: Sequence[Mapping[str, Any]], observed: Observed, now: float
    ) -> None:
        by_name = {r.name: r for r in observed.adapters if r.origin == "LoRAAdapter"}
        for raw in bodies:
            meta = raw["metadata"]
            r = by_name.get(meta["name"])
            if r is None or not decide.points_at(raw, pool.metadata.name):
                continue
            presence = observed.of(r.name) if r.phase != AdapterPhase.CONFLICT else NOWHERE
            status = adapter_object_status(
                pool.metadata.name,
                meta.get("generation"),
                r,
                presence,
                routable=observed.router_ready,
                blocked="; ".join(observed.plan_errors),
                placed=observed.placement.placed(r.name, pool.spec.replicas)
                if observed.placement and r.phase not in (AdapterPhase.FAILED, AdapterPhase.CONFLICT)
                else None,
            )
            await self._write_status(raw, status, now)
