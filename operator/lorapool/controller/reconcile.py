"""One level-based reconcile of a LoRAPool: read everything, compute everything, apply, report.

Called for every event on a pool, its LoRAAdapters, its Deployments and engine pods, and
by the drift resync; it never branches on which event it was. Pure work (plan, render,
status) is delegated to the core; this module only sequences I/O. ``Reconciler`` coalesces
bursts of triggers into one run per pool at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from lorapool.api.load import describe
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.api.peft import parse_adapter_config, same_base_model
from lorapool.controller.kube import Kube
from lorapool.controller.status import (
    AdapterResult,
    Observed,
    condition,
    merge_conditions,
    pool_status,
    status_changed,
)
from lorapool.errors import LoRAPoolError, PlanError, SourceError
from lorapool.plan.adapters import PoolAdapter, merge_adapters
from lorapool.plan.gpus import GPUS
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import names
from lorapool.render.manifests import RenderOptions, render_pool

log = logging.getLogger("lorapool.operator")

RECONCILES = Counter("lorapool_operator_reconciles_total", "Pool reconciles", ["result"])
DURATION = Histogram(
    "lorapool_operator_reconcile_duration_seconds",
    "Time to reconcile one pool",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

ConfigFetcher = Callable[[str, str | None], Any]  # async (source, revision) -> adapter_config dict


@dataclass(frozen=True)
class Settings:
    """Operator settings; see `lorapool operator --help` for units and defaults."""

    render: RenderOptions
    metadata_timeout_s: float = 10.0
    metadata_concurrency: int = 8


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _adapter_metadata(
    adapter: PoolAdapter, base_model: str, fetch: ConfigFetcher, timeout_s: float
) -> AdapterResult:
    """Rank and verdict for one adapter from its adapter_config.json, falling back to the spec."""
    spec = adapter.spec
    try:
        raw = await asyncio.wait_for(fetch(spec.source, spec.revision), timeout_s)
        config = parse_adapter_config(raw, where=f"{spec.name}: adapter_config.json")
    except (SourceError, TimeoutError, OSError) as exc:
        reason = str(exc) or f"timed out after {timeout_s:g}s"
        if spec.rank is not None:
            return AdapterResult(
                spec.name,
                adapter.origin,
                spec.rank,
                "Ready",
                f"source not readable by the operator ({reason}); using rank {spec.rank} from the spec",
            )
        return AdapterResult(
            spec.name,
            adapter.origin,
            None,
            "Pending",
            f"cannot read adapter_config.json to learn its rank: {reason}; fix the source or set {adapter.field}.rank",
        )
    except LoRAPoolError as exc:
        return AdapterResult(spec.name, adapter.origin, spec.rank, "Failed", str(exc))
    if config.problems:
        return AdapterResult(spec.name, adapter.origin, config.rank, "Failed", "; ".join(config.problems))
    if not same_base_model(base_model, config.base_model):
        return AdapterResult(
            spec.name,
            adapter.origin,
            config.rank,
            "Failed",
            f"trained on {config.base_model!r}, but the pool serves {base_model!r}; "
            "attach it to a pool with that base model",
        )
    if spec.rank is not None and spec.rank != config.rank:
        return AdapterResult(
            spec.name,
            adapter.origin,
            config.rank,
            "Failed",
            f"{adapter.field}.rank={spec.rank} but adapter_config.json says {config.rank}; "
            "fix or remove the rank in the spec",
        )
    return AdapterResult(spec.name, adapter.origin, config.rank, "Ready")


class PoolReconciler:
    """Reconciles pools; thread-safe triggering, one run per pool at a time."""

    def __init__(self, kube: Kube, fetch: ConfigFetcher, settings: Settings) -> None:
        self.kube = kube
        self.fetch = fetch
        self.settings = settings
        self._dirty: dict[tuple[str, str], bool] = {}
        self._workers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.known: set[tuple[str, str]] = set()

    def trigger(self, namespace: str, name: str) -> None:
        """Ask for a reconcile of one pool; bursts coalesce into one run after the current one."""
        key = (namespace, name)
        self.known.add(key)
        self._dirty[key] = True
        if key not in self._workers or self._workers[key].done():
            self._workers[key] = asyncio.create_task(self._work(key), name=f"reconcile {namespace}/{name}")

    async def _work(self, key: tuple[str, str]) -> None:
        while self._dirty.get(key):
            self._dirty[key] = False
            started = time.monotonic()
            try:
                await self.reconcile(*key)
                RECONCILES.labels("ok").inc()
            except Exception:  # a reconcile must never kill the operator; the resync retries
                RECONCILES.labels("error").inc()
                log.exception("Failed to reconcile LoRAPool", extra={"pool": "/".join(key)})
                await asyncio.sleep(2)
                self._dirty[key] = True
            finally:
                DURATION.observe(time.monotonic() - started)

    async def _io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def reconcile(self, namespace: str, name: str) -> None:
        body = await self._io(self.kube.get, "LoRAPool", namespace, name)
        if body is None:
            self.known.discard((namespace, name))
            return  # deleted: ownerReferences let the garbage collector remove the children
        try:
            pool = LoRAPool.model_validate(body)
        except ValidationError as exc:
            await self._write_pool_status(
                body,
                {"observedGeneration": body["metadata"].get("generation"), "conditions": _invalid(describe(exc), body)},
            )
            return
        adapter_bodies = await self._io(self.kube.list, "LoRAAdapter", namespace)
        objects, bad = [], {}
        for raw in adapter_bodies:
            if (raw.get("spec") or {}).get("poolRef", {}).get("name") != name:
                continue
            try:
                objects.append(LoRAAdapter.model_validate(raw))
            except ValidationError as exc:
                bad[raw["metadata"]["name"]] = "; ".join(describe(exc))
        merged = merge_adapters(pool, objects)

        sem = asyncio.Semaphore(self.settings.metadata_concurrency)

        async def one(adapter: PoolAdapter) -> AdapterResult:
            async with sem:
                return await _adapter_metadata(
                    adapter, pool.spec.base_model.name, self.fetch, self.settings.metadata_timeout_s
                )

        results = list(await asyncio.gather(*(one(a) for a in merged.adapters)))
        results += [AdapterResult(n, "LoRAAdapter", None, "Conflict", m) for n, m in merged.conflicts]
        results += [AdapterResult(n, "LoRAAdapter", None, "Failed", m) for n, m in bad.items()]
        servable = [a for a, r in zip(merged.adapters, results, strict=False) if r.phase != "Failed"]
        by_name = {r.name: r for r in results}

        plan_status, plan_errors, plan = None, [], None
        try:
            plan = plan_pool(
                pool.spec, [AdapterRank(a.spec.name, a.field, by_name[a.spec.name].rank) for a in servable]
            )
            plan_status = plan.to_status()
        except PlanError as exc:
            plan_errors = list(exc.problems)

        # Adapters whose rank exceeds an explicit maxLoraRank are refused per adapter, not per pool.
        if plan is not None:
            for r in results:
                if r.rank and r.rank > plan.max_lora_rank and r.phase == "Ready":
                    by_name[r.name] = AdapterResult(
                        r.name,
                        r.origin,
                        r.rank,
                        "Failed",
                        f"rank {r.rank} exceeds the pool's max-lora-rank {plan.max_lora_rank}",
                    )
            results = [by_name[r.name] for r in results]
            loadable = [a for a in servable if by_name[a.spec.name].phase != "Failed"]
            for obj in render_pool(pool, plan, loadable, self.settings.render):
                if await self._io(self.kube.apply, obj):
                    log.info(
                        "Applied %s",
                        obj["kind"],
                        extra={"pool": f"{namespace}/{name}", "object": obj["metadata"]["name"]},
                    )

        engine = await self._io(self.kube.get, "Deployment", namespace, names.engine(name))
        router = await self._io(self.kube.get, "Deployment", namespace, names.router(name))
        unschedulable = await self._unschedulable(pool)
        observed = Observed(
            generation=body["metadata"].get("generation"),
            plan=plan_status,
            plan_errors=plan_errors,
            adapters=results,
            desired_replicas=pool.spec.replicas,
            engine=(engine or {}).get("status"),
            engine_generation_current=bool(engine)
            and (engine.get("status") or {}).get("observedGeneration", 0) >= engine["metadata"].get("generation", 0),
            router_ready=bool(router) and int((router.get("status") or {}).get("readyReplicas") or 0) > 0,
            unschedulable=unschedulable,
            endpoint=names.endpoint(name, namespace),
            selector=names.selector_string(name, "engine"),
        )
        status = pool_status(observed)
        await self._write_pool_status(body, status)
        await self._write_adapter_statuses(pool, adapter_bodies, by_name)

    async def _unschedulable(self, pool: LoRAPool) -> str | None:
        pods = await self._io(
            self.kube.list, "Pod", pool.metadata.namespace, names.selector_string(pool.metadata.name, "engine")
        )
        for pod in pods:
            for cond in (pod.get("status") or {}).get("conditions") or []:
                if (
                    cond.get("type") == "PodScheduled"
                    and cond.get("status") == "False"
                    and cond.get("reason") == "Unschedulable"
                ):
                    gpu = pool.spec.gpu
                    wanted = ", ".join(GPUS[gpu.product].node_products)
                    return (
                        f"engine pod {pod['metadata']['name']} cannot be scheduled: {cond.get('message', '')}; it needs "
                        f"a node labelled nvidia.com/gpu.product in [{wanted}] with {gpu.count} free nvidia.com/gpu: "
                        "add such nodes or change spec.gpu"
                    )
        return None

    async def _write_pool_status(self, body: Mapping[str, Any], status: dict[str, Any]) -> None:
        current = body.get("status") or {}
        status["conditions"] = merge_conditions(current.get("conditions") or [], status["conditions"], _now())
        if not status_changed(current, status):
            return
        meta = body["metadata"]
        await self._io(self.kube.patch_status, "LoRAPool", meta["namespace"], meta["name"], status)
        await self._events(body, current, status)

    async def _events(self, body: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Events on transitions a human cares about: readiness and flag changes."""

        def ready(s: Mapping[str, Any]) -> Mapping[str, Any]:
            return next((c for c in s.get("conditions") or [] if c.get("type") == "Ready"), {})

        before, after = ready(old), ready(new)
        if before.get("status") != after.get("status") or before.get("reason") != after.get("reason"):
            kind = "Normal" if after.get("status") == "True" else "Warning"
            if after.get("reason") in ("RollingOut", "WaitingForReplicas", "WaitingForRouter"):
                kind = "Normal"
            await self._io(
                self.kube.event,
                body,
                reason=after.get("reason", "Unknown"),
                message=after.get("message", ""),
                type_=kind,
            )
        old_plan, new_plan = old.get("plan") or {}, new.get("plan") or {}
        flags = ("maxLoras", "maxLoraRank", "maxCpuLoras")
        if new_plan and any(old_plan.get(f) != new_plan.get(f) for f in flags):
            message = ", ".join(f"{f}={new_plan[f]}" for f in flags)
            await self._io(self.kube.event, body, reason="PlanChanged", message=f"vLLM flags: {message}")

    async def _write_adapter_statuses(
        self, pool: LoRAPool, bodies: list[dict[str, Any]], results: Mapping[str, AdapterResult]
    ) -> None:
        for raw in bodies:
            meta = raw["metadata"]
            if (raw.get("spec") or {}).get("poolRef", {}).get("name") != pool.metadata.name:
                continue
            r = results.get(meta["name"])
            if r is None:
                continue
            ok = r.phase == "Ready"
            reason = {"Ready": "Servable", "Pending": "SourceUnreadable", "Conflict": "NameConflict"}.get(
                r.phase, "Invalid"
            )
            conditions = [
                {
                    "type": "Ready",
                    "status": "True" if ok else "False",
                    "reason": reason,
                    "message": r.message or f"served by pool {pool.metadata.name}",
                    "observedGeneration": meta.get("generation"),
                },
                {
                    "type": "Degraded",
                    "status": "False" if ok or (r.phase == "Pending" and not r.message) else "True",
                    "reason": reason,
                    "message": r.message,
                    "observedGeneration": meta.get("generation"),
                },
            ]
            status = {
                "observedGeneration": meta.get("generation"),
                "pool": pool.metadata.name,
                "rank": r.rank,
                "phase": r.phase,
                "message": r.message,
            }
            current = raw.get("status") or {}
            status["conditions"] = merge_conditions(current.get("conditions") or [], conditions, _now())
            if status_changed(current, status):
                await self._io(self.kube.patch_status, "LoRAAdapter", meta["namespace"], meta["name"], status)
                if r.phase in ("Failed", "Conflict") and current.get("phase") != r.phase:
                    await self._io(self.kube.event, raw, reason=reason, message=r.message, type_="Warning")


def _invalid(problems: list[str], body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Conditions of a pool whose spec the models refuse: not Ready, Degraded and Stalled."""
    g = body["metadata"].get("generation")
    message = "; ".join(problems)
    failing = {"Degraded", "Stalled"}
    return [
        condition(type_, type_ in failing, "InvalidSpec", message, g)
        for type_ in ("Ready", "Progressing", "Degraded", "Reconciling", "Stalled")
    ]
