"""Regime (e): a large catalog over many replicas, k-of-N placement against all-replica routing.

    python bench/run.py --large-catalog          # the five systems of regime (e), ~19 min on 2 cores

Every adapter is registered on every replica at start (``--lora-modules``, as the other regimes
do). ``lorapool placement``'s replicas then keep only their share (registered last, so their CPU
cache holds it; the rest unloaded before traffic, as their sidecars would), and a loop beside
the router runs the operator's placement step on the product's own code: each engine's
/metrics sampled into the sidecar's ``Window`` (``sidecar.observations``), the closed windows
encoded as the sidecars' reports, the router's last closed window of request counts per adapter
(``GET /lorapool/requests``, the router started with ``--requests-window-s`` = the loop's window)
encoded as its Pod's ``lorapool.io/requests`` annotation, then the operator's ``observed_load``
and ``decide_placement`` (``next_k`` and ``place`` from ``plan.placement``, the rule from
``scaling_rule``). Adapters move
with the engines' runtime API (load on the new holders first, then unload from the old). The
router is the ordinary ``lorapool router --policy affinity``: its serves-model filter sends a
request only to replicas whose ``/v1/models`` lists the adapter, so registered = held. The
other systems route over the same fleet with every adapter everywhere.

The traffic is Zipf; at ``shift_at_s`` the popularity is permuted (a new hot set), and the
result records how long the new hottest adapter took to be loaded on as many replicas as the
placement loop gave it (its convergence time).

Pure parts (the shifted schedule, the placement step ``decide``, the convergence time, the
timeline) are functions over plain data with tests in tests/router/test_bench_large_catalog.py;
the shell below them starts processes and talks HTTP. The results' RESULTS.md section and plot are
``bench/large_catalog_report.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import results
from bench.loadgen import Outcome, Planned, RunResult, Workload, adapter_name, percentile, schedule
from bench.scenarios import ENVOY_PICKER, LORAPOOL_AFFINITY, LORAPOOL_PLACEMENT
from bench.systems import FleetSpec, System, started_in_parallel
from lorapool.api import requests as router_requests
from lorapool.api.models import LoRAPool
from lorapool.api.pods import engine_pods, router_pods
from lorapool.api.report import ANNOTATION, Observations, ReplicaReport, encode
from lorapool.api.requests import RequestWindow
from lorapool.plan.holders import decide_placement, observed_load, scaling_rule
from lorapool.plan.placement import KState, shares
from lorapool.sidecar.observations import Window, parse_sample

PLACEMENT = LORAPOOL_PLACEMENT
AFFINITY = LORAPOOL_AFFINITY
CONSISTENT_HASH = "vllm-router consistent_hash"


@dataclass(frozen=True)
class CatalogScenario:
    """A regime (e) scenario: the fleet, the Zipf workload and when its popularity shifts."""

    name: str
    about: str
    fleet: FleetSpec
    workload: Workload
    shift_at_s: float
    shift_seed: int = 11
    warmup_s: float = 5.0
    slo_ttft_s: float = 0.5
    window_s: float = 2.0  # the sidecars' observation window (product default 60 s), simulated seconds
    sample_s: float = 0.25  # how often the loop reads the metrics within a window
    regime: str = "e"


# --- the workload ---------------------------------------------------------------------------


def popularity_shift(adapters: int, seed: int) -> dict[str, str]:
    """A seeded permutation of adapter names: after the shift, requests for ``a`` go to ``shift[a]``."""
    names = [adapter_name(i) for i in range(adapters)]
    shuffled = names[:]
    random.Random(seed).shuffle(shuffled)
    return dict(zip(names, shuffled, strict=True))


def shifted_schedule(w: Workload, shift_at_s: float, seed: int) -> list[Planned]:
    """``schedule(w)`` with every request from ``shift_at_s`` on renamed by ``popularity_shift``.

    Arrivals, prompt lengths and output lengths stay those of ``w``; only which adapter is hot
    changes, so the systems see the same load before and after the shift.
    """
    shift = popularity_shift(w.adapters, seed)
    out = []
    for p in schedule(w):
        if p.at_s < shift_at_s:
            out.append(p)
            continue
        model = shift[p.model]
        prompt = f"[{model}]" + p.prompt.removeprefix(f"[{p.model}]")
        out.append(dataclasses.replace(p, model=model, prompt=prompt))
    return out


def hottest(plan: Iterable[Planned], since_s: float = 0.0, until_s: float = math.inf) -> str:
    """The adapter with the most requests in [since_s, until_s)."""
    counts = Counter(p.model for p in plan if since_s <= p.at_s < until_s)
    return max(sorted(counts), key=lambda m: counts[m])


# --- the product's placement decision, fed as the operator feeds it ------------------------------

POOL_NAME = "bench"


def bench_pool(replicas: int, max_cpu_loras: int) -> LoRAPool:
    """The LoRAPool the operator would hold for the fleet: k-of-N placement on auto, defaults elsewhere."""
    return LoRAPool.model_validate(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": POOL_NAME, "namespace": "default"},
            "spec": {
                "baseModel": {
                    "name": "meta-llama/Meta-Llama-3-8B-Instruct",
                    "source": "hf://meta-llama/Meta-Llama-3-8B-Instruct",
                },
                "gpu": {"product": "A100-80GB"},
                "replicas": replicas,
                "lora": {"maxCpuLoras": max_cpu_loras},
                "placement": {"replicasPerAdapter": "auto"},
            },
        }
    )


def in_simulated_time(obs: Observations, scale: float) -> Observations:
    """A window's observations with TTFT in simulated seconds (the engines' histograms are wall clock)."""
    return dataclasses.replace(
        obs,
        ttft_p50_s=None if obs.ttft_p50_s is None else obs.ttft_p50_s / scale,
        ttft_p99_s=None if obs.ttft_p99_s is None else obs.ttft_p99_s / scale,
    )


def report_pods(observations: Mapping[str, Observations]) -> list[dict[str, Any]]:
    """Pod objects carrying each replica's report, as the sidecars write them and the operator reads them."""
    return [
        {
            "metadata": {
                "name": f"{POOL_NAME}-engine-{slot}",
                "annotations": {ANNOTATION: encode(ReplicaReport(engine_healthy=True, observations=obs))},
            }
        }
        for slot, obs in sorted(observations.items())
    ]


def requests_in_simulated_time(w: RequestWindow, wall_t0: float, scale: float) -> RequestWindow:
    """The router's window (wall seconds, ``end`` in Unix seconds) on the loop's simulated clock, which
    starts at ``wall_t0`` (Unix seconds): rates per simulated second, as the engines' observations are."""
    return dataclasses.replace(w, window_s=w.window_s / scale, end=(w.end - wall_t0) / scale)


def router_pod_list(window: RequestWindow | None) -> list[dict[str, Any]]:
    """The router's Pod carrying its last closed window, as the router writes it and the operator reads it."""
    if window is None:
        return []
    annotations = {router_requests.ANNOTATION: router_requests.encode(window)}
    return [{"metadata": {"name": f"{POOL_NAME}-router-0", "annotations": annotations}}]


def decide(
    pool: LoRAPool,
    adapters: Sequence[str],
    previous: Mapping[str, KState],
    observations: Mapping[str, Observations],
    now_s: float,
    requests: RequestWindow | None = None,
) -> tuple[dict[str, tuple[str, ...]], dict[str, KState]]:
    """One placement step of the operator: load from the reports and the router's request counts
    (``requests``, on the same clock as ``now_s``), then ``decide_placement``.

    Returns holders by replica identity ("0".."N-1") and each adapter's k. Pure.
    """
    load = observed_load(engine_pods(report_pods(observations)), router_pods(router_pod_list(requests)), now_s)
    capacity = pool.spec.lora.max_cpu_loras
    if not isinstance(capacity, int):
        raise ValueError(f"spec.lora.maxCpuLoras={capacity!r}: the benchmark's pool needs a number")
    placement = decide_placement(pool, adapters, capacity, previous, load, now_s)
    if placement.holders is None:  # every replica holds everything (a small catalog)
        every = tuple(str(i) for i in range(pool.spec.replicas))
        return {a: every for a in adapters}, dict(placement.k)
    return {a: tuple(str(r) for r in hs) for a, hs in placement.holders.items()}, dict(placement.k)


# --- what the run measured ---------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """One runtime API call that completed: ``kind`` is load or unload, ``at_s`` simulated seconds."""

    at_s: float
    kind: str
    adapter: str
    replica: str


def holders_over_time(initial: Iterable[str], moves: Iterable[Move], adapter: str) -> list[tuple[float, int]]:
    """(time, replicas holding ``adapter``) after each of its moves, starting at (-inf, initial)."""
    held = set(initial)
    out = [(-math.inf, len(held))]
    for m in sorted(moves, key=lambda m: m.at_s):
        if m.adapter != adapter:
            continue
        (held.add if m.kind == "load" else held.discard)(m.replica)
        out.append((m.at_s, len(held)))
    return out


def convergence_s(timeline: Sequence[tuple[float, int]], k: int, since_s: float) -> float | None:
    """Seconds from ``since_s`` until the holders reach ``k`` (and stay there); None if never.

    0.0 when the adapter already had ``k`` holders at ``since_s``.
    """
    reached: float | None = None
    for at_s, count in timeline:
        if count >= k:
            if reached is None:
                reached = max(at_s, since_s)
        else:
            reached = None
    return None if reached is None else reached - since_s


def goodput_timeline(
    outcomes: Iterable[Outcome], slo_ttft_s: float, duration_s: float, bin_s: float = 1.0
) -> list[float]:
    """Good requests (done, TTFT within the SLO) per second, by the second they were sent."""
    bins = [0.0] * max(1, math.ceil(duration_s / bin_s))
    for o in outcomes:
        good = o.status == 200 and not o.error and o.ttft_s is not None and o.ttft_s <= slo_ttft_s
        i = int(o.sent_s // bin_s)
        if good and 0 <= i < len(bins):
            bins[i] += 1.0 / bin_s
    return bins


# --- the placement loop (shell) ------------------------------------------------------------------


# Adapters were placed before the run (at k = 1, long enough ago that the expand interval allows
# a change at once): the state of a pool that has served this catalog for a while.
PLACED_BEFORE_S = -3600.0


@dataclass
class PlacementLoop:
    """The operator's placement step every window, fed by sidecar-style reports; moves by runtime API.

    Per replica, the engine's /metrics is sampled every ``sample_s`` into the sidecar's own
    ``Window`` (simulated clock); each closed window's ``Observations`` go through the report
    encoding to the operator's ``observed_load`` and ``decide_placement`` (``decide``), with the
    router's last closed window of request counts (``GET /lorapool/requests``) as its Pod's
    annotation, in simulated seconds. New
    holders load first, then old holders unload (the product's sidecars drain instead; here
    the unload follows the new holders' loads at once).
    """

    pool: LoRAPool
    paths: dict[str, str]  # adapter -> its PEFT directory
    scale: float  # wall seconds per simulated second
    window_s: float
    sample_s: float
    replicas: dict[str, str] = field(default_factory=dict)  # identity ("0", "1", ...) -> engine URL
    state: dict[str, KState] = field(default_factory=dict)
    holders: dict[str, tuple[str, ...]] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)
    k_changes: list[tuple[float, str, int]] = field(default_factory=list)
    failed_calls: list[str] = field(default_factory=list)
    busiest: list[tuple[float, list[tuple[str, float | None]]]] = field(default_factory=list)  # per window
    router: str = ""  # the router's URL: its GET /lorapool/requests feeds the rates ("" : no rates)
    rates: list[tuple[float, float | None, list[tuple[str, float]]]] = field(default_factory=list)  # per window
    t0: float = 0.0
    wall_t0: float = 0.0  # Unix seconds at t0 (the router dates its windows in Unix seconds)

    def now_s(self) -> float:
        return (time.perf_counter() - self.t0) / self.scale

    def initial(self) -> dict[str, tuple[str, ...]]:
        """Every adapter at k_min, placed by rendezvous within capacity (the operator's first decision)."""
        previous = {a: KState(1, PLACED_BEFORE_S) for a in self.paths}
        self.holders, self.state = decide(self.pool, sorted(self.paths), previous, {}, 0.0)
        return self.holders

    async def _call(self, session: Any, replica: str, kind: str, adapter: str) -> bool:
        url = f"{self.replicas[replica]}/v1/{kind}_lora_adapter"
        body = {"lora_name": adapter} if kind == "unload" else {"lora_name": adapter, "lora_path": self.paths[adapter]}
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                self.failed_calls.append(f"{kind} {adapter} on {replica}: {resp.status} {(await resp.text())[:120]}")
                return False
        self.moves.append(Move(self.now_s(), kind, adapter, replica))
        return True

    async def _calls(
        self, session: Any, calls: Sequence[tuple[str, str, str]], per_replica: int = 4
    ) -> list[tuple[str, str, str]]:
        """Run (replica, kind, adapter) calls, a few at a time per replica; returns the failed ones."""
        gates = {r: asyncio.Semaphore(per_replica) for r in self.replicas}

        async def one(replica: str, kind: str, adapter: str) -> bool:
            async with gates[replica]:
                return await self._call(session, replica, kind, adapter)

        done = await asyncio.gather(*(one(*c) for c in calls))
        return [c for c, ok in zip(calls, done, strict=True) if not ok]

    async def run(self, session: Any, until_s: float) -> None:
        """Windows until ``until_s`` (simulated): sample, decide with the product's code, move."""

        async def text(url: str) -> str:
            async with session.get(f"{url}/metrics") as resp:
                return str(await resp.text())

        windows = {r: Window(window_s=self.window_s, max_gap_s=self.window_s) for r in self.replicas}
        closed: dict[str, Observations] = {}
        while self.now_s() < until_s:
            pages = await asyncio.gather(*(text(u) for u in self.replicas.values()))
            now = self.now_s()
            for replica, page in zip(self.replicas, pages, strict=True):
                obs = windows[replica].add(parse_sample(page), now)
                if obs is not None:
                    closed[replica] = in_simulated_time(obs, self.scale)
            if len(closed) == len(self.replicas):
                await self._step(session, closed, now, await self._requests(session))
                closed = {}
            await asyncio.sleep(self.sample_s * self.scale)

    async def _requests(self, session: Any) -> RequestWindow | None:
        """The router's last closed window in simulated seconds; None before the first closes (404)."""
        if not self.router:
            return None
        async with session.get(f"{self.router}/lorapool/requests") as resp:
            if resp.status != 200:
                return None
            w = router_requests.decode(await resp.text())
        return None if w is None else requests_in_simulated_time(w, self.wall_t0, self.scale)

    async def _step(
        self, session: Any, observations: Mapping[str, Observations], now: float, requests: RequestWindow | None
    ) -> None:
        wanted, decided = decide(self.pool, sorted(self.paths), self.state, observations, now, requests)
        if requests is not None:
            top = sorted(requests.counts, key=lambda a: (-requests.counts[a], a))[:3]
            total = requests.total / requests.window_s
            self.rates.append((round(now, 2), round(total, 1), [(a, round(requests.rate(a), 1)) for a in top]))
        else:
            self.rates.append((round(now, 2), None, []))
        for adapter, st in decided.items():
            if adapter in self.state and st.k != self.state[adapter].k:
                self.k_changes.append((now, adapter, st.k))
        self.state = decided
        slow = sorted(observations.items(), key=lambda kv: -(kv[1].ttft_p99_s or 0.0))[:3]
        self.busiest.append((round(now, 2), [(r, o.ttft_p99_s) for r, o in slow]))
        await self._apply(session, wanted)

    async def _apply(self, session: Any, wanted: Mapping[str, tuple[str, ...]]) -> None:
        """Load on new holders first, then unload from replicas that no longer hold (make before break)."""
        loads = [(r, "load", a) for a, hs in wanted.items() for r in hs if r not in self.holders.get(a, ())]
        unloads = [(r, "unload", a) for a, hs in self.holders.items() for r in hs if r not in wanted.get(a, ())]
        failed = await self._calls(session, loads) if loads else []
        if unloads:
            await self._calls(session, unloads)
        missing = {(a, r) for r, _, a in failed}
        self.holders = {a: tuple(r for r in hs if (a, r) not in missing) for a, hs in wanted.items()}


# --- the run (shell) ------------------------------------------------------------------------------


def scenario_dict(s: CatalogScenario) -> dict[str, Any]:
    """The scenario as results.json describes it (the keys of ``run.describe`` plus the shift and loop)."""
    return {
        "name": s.name,
        "regime": s.regime,
        "about": s.about,
        "slo_ttft_s": s.slo_ttft_s,
        "time_scale": s.fleet.time_scale,
        "warmup_s": s.warmup_s,
        "fleet": dataclasses.asdict(s.fleet),
        "workload": dataclasses.asdict(s.workload),
        "shift_at_s": s.shift_at_s,
        "shift_seed": s.shift_seed,
        "placement_window_s": s.window_s,
        "scaling_rule": dataclasses.asdict(scaling_rule(bench_pool(s.fleet.replicas, s.fleet.max_cpu_loras))),
    }


async def _measure(
    url: str, sims: list[str], s: CatalogScenario, plan: list[Planned], loop: PlacementLoop | None
) -> tuple[Any, dict[str, float], dict[str, float]]:
    import aiohttp

    from bench.loadgen import run_open_loop

    scale = s.fleet.time_scale
    wall_plan = [dataclasses.replace(p, at_s=p.at_s * scale) for p in plan]
    at_warmup: dict[str, float] = {}

    async def snapshot() -> None:
        await asyncio.sleep(s.warmup_s * scale)
        at_warmup.update(await asyncio.to_thread(scrape_sims, sims))

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30 * scale)) as session:
        snap = asyncio.create_task(snapshot())
        task = None
        if loop is not None:
            loop.t0, loop.wall_t0 = time.perf_counter(), time.time()
            loop.router = url
            task = asyncio.create_task(loop.run(session, until_s=s.workload.duration_s))
        result = await run_open_loop(url, wall_plan, drain_timeout_s=DRAIN_S * scale)
        await snap
        if task is not None:
            await task
    at_end = await asyncio.to_thread(scrape_sims, sims)
    return result, at_warmup, at_end


def scrape_sims(urls: Sequence[str]) -> dict[str, float]:
    """The replicas' LoRA loads by source and stall seconds, summed (as ``bench.run`` reads them)."""
    from lorapool_dev.testing.scrape import metric_value, samples, scrape

    totals: dict[str, float] = {"cpu": 0.0, "disk": 0.0, "stall_s": 0.0}
    for url in urls:
        page = scrape(url, timeout_s=10)
        for labels, value in samples(page).get("sim:lora_loads_total", []):
            totals[labels.get("from", "")] = totals.get(labels.get("from", ""), 0.0) + value
        totals["stall_s"] += metric_value(page, "sim:lora_load_stall_seconds_total")
    return totals


DRAIN_S = 10.0  # simulated seconds after the last arrival before unfinished requests count as failed


def _router_retries(url: str) -> dict[str, float]:
    from lorapool_dev.testing.scrape import samples, scrape

    return {labels.get("reason", ""): v for labels, v in samples(scrape(url)).get("lorapool_router_retries_total", [])}


def run_cell(s: CatalogScenario, system: System, adapter_root: Path) -> dict[str, Any]:
    """One system on the scenario, with fresh replicas (every adapter registered on each).

    Called by ``run`` and ``main``: 1. the shifted schedule, 2. the fleet (placement's shared one,
    with its loop) and the system in front of it, 3. the open loop, 4. the cell's summary."""
    from bench.systems import sim_fleet, write_adapters

    scale = s.fleet.time_scale
    started = time.monotonic()
    plan = shifted_schedule(s.workload, s.shift_at_s, s.shift_seed)
    paths = {name: str(path) for name, path in write_adapters(adapter_root, s.fleet.adapters)}
    loop: PlacementLoop | None = None
    initial: dict[str, tuple[str, ...]] = {}
    with ExitStack() as stack:
        if system.name == PLACEMENT:
            loop, initial, sims, system = _placement_fleet(stack, s, system, paths)
        else:
            sims = stack.enter_context(sim_fleet(s.fleet, adapter_root))
        url = stack.enter_context(system.start(sims, max_cpu_loras=s.fleet.max_cpu_loras, time_scale=scale))
        result, before, after = asyncio.run(_measure(url, sims, s, plan, loop))
        retries = _router_retries(url) if system.kind == "lorapool" else {}
    summary = _cell_summary(s, system, plan, result, before, after, retries)
    summary.update(wall_s=time.monotonic() - started, loadavg_1m_end=os.getloadavg()[0])
    if loop is not None:
        summary.update(placement_summary(loop, initial, summary["hot_after"], s.shift_at_s))
    return summary


def _placement_fleet(
    stack: ExitStack, s: CatalogScenario, system: System, paths: Mapping[str, str]
) -> tuple[PlacementLoop, dict[str, tuple[str, ...]], list[str], System]:
    """``lorapool placement``'s side of ``run_cell``: the loop, its initial placement, the replicas
    holding their share of it (closed with ``stack``) and the router counting requests per adapter."""
    scale = s.fleet.time_scale
    ids = [str(i) for i in range(s.fleet.replicas)]
    loop = PlacementLoop(bench_pool(s.fleet.replicas, s.fleet.max_cpu_loras), paths, scale, s.window_s, s.sample_s)
    initial = loop.initial()
    sims = stack.enter_context(share_fleet(s.fleet, paths, shares(initial, ids)))
    loop.replicas = dict(zip(ids, sims, strict=True))
    # the router counts requests per adapter over the loop's window (wall seconds), as the operator reads them
    system = dataclasses.replace(system, args=(*system.args, "--requests-window-s", f"{s.window_s * scale:g}"))
    return loop, initial, sims, system


def _cell_summary(
    s: CatalogScenario,
    system: System,
    plan: Sequence[Planned],
    result: RunResult,
    before: Mapping[str, float],
    after: Mapping[str, float],
    retries: dict[str, float],
) -> dict[str, Any]:
    """The cell's numbers for results.json, in simulated seconds: the goodput timeline (every request),
    then after the warm-up the summary, adapter loads per 1k requests, goodput after the shift and
    the adapters with the worst p99 TTFT. Turns ``result``'s outcomes into simulated time."""
    from bench.loadgen import summarize

    scale = s.fleet.time_scale
    timeline = goodput_timeline(
        [
            dataclasses.replace(o, sent_s=o.sent_s / scale, ttft_s=None if o.ttft_s is None else o.ttft_s / scale)
            for o in result.outcomes
        ],
        s.slo_ttft_s,
        s.workload.duration_s,
    )
    result.outcomes = [o for o in result.outcomes if o.sent_s >= s.warmup_s * scale]
    for o in result.outcomes:
        o.sent_s /= scale
        o.ttft_s = o.ttft_s / scale if o.ttft_s is not None else None
        o.done_s = o.done_s / scale if o.done_s is not None else None
    summary = summarize(result, window_s=s.workload.duration_s - s.warmup_s, slo_ttft_s=s.slo_ttft_s)
    after_shift = [o for o in result.outcomes if o.sent_s >= s.shift_at_s]
    n = max(1, summary["requests"])
    loads = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("cpu", "disk", "stall_s")}
    summary.update(
        scenario=s.name,
        system=system.name,
        stalls_per_1k=1000.0 * (loads["cpu"] + loads["disk"]) / n,
        disk_loads_per_1k=1000.0 * loads["disk"] / n,
        stall_s_per_1k=1000.0 * loads["stall_s"] / n,
        goodput_after_shift_rps=summarize_goodput(after_shift, s.slo_ttft_s, s.workload.duration_s - s.shift_at_s),
        goodput_timeline=timeline,
        hot_before=hottest(plan, 0.0, s.shift_at_s),
        hot_after=hottest(plan, s.shift_at_s),
        router_retries=retries,
        worst_adapters=worst_adapters(result.outcomes),
    )
    return summary


def worst_adapters(outcomes: Iterable[Outcome], n: int = 5) -> list[list[Any]]:
    """The ``n`` adapters with the highest p99 TTFT (a failed request counts as infinite): each as
    [name, requests, p99 TTFT]. Pure."""
    by_model: dict[str, list[float]] = {}
    for o in outcomes:
        by_model.setdefault(o.model, []).append(o.ttft_s if o.ttft_s is not None and not o.error else math.inf)
    worst = sorted(by_model, key=lambda m: -percentile(by_model[m], 99))[:n]
    return [[m, len(by_model[m]), percentile(by_model[m], 99)] for m in worst]


def summarize_goodput(outcomes: Sequence[Outcome], slo_ttft_s: float, window_s: float) -> float:
    good = sum(
        1 for o in outcomes if o.status == 200 and not o.error and o.ttft_s is not None and o.ttft_s <= slo_ttft_s
    )
    return good / window_s if window_s > 0 else math.nan


@contextmanager
def share_fleet(spec: FleetSpec, paths: Mapping[str, str], share: Mapping[str, Sequence[str]]) -> Iterator[list[str]]:
    """Replicas "0".."N-1" that hold only their share when traffic starts.

    Each starts like the other systems' replicas, every adapter registered (so every path has
    been read once, as in the all-replica fleet: moves later pay a warm disk read, not a first
    read), with its share registered last so that the share is what its CPU cache holds; then
    the rest is unloaded through the runtime API, as the replica's sidecar would.
    """
    import urllib.request

    from lorapool_dev.testing.components import start_sim

    def unload(url: str, name: str) -> None:
        body = json.dumps({"lora_name": name}).encode()
        req = urllib.request.Request(f"{url}/v1/unload_lora_adapter", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()

    def start(i: int) -> tuple[str, Any]:
        mine = share.get(str(i), ())
        rest = [a for a in paths if a not in set(mine)]
        modules = {a: paths[a] for a in (*rest, *mine)}
        sim = start_sim(
            max_loras=spec.max_loras, max_cpu_loras=spec.max_cpu_loras, max_lora_rank=8,
            max_num_seqs=spec.max_num_seqs, time_scale=spec.time_scale, seed=spec.seed + i, log_level="WARNING",
            lora_modules=modules, extra=spec.extra, timeout_s=180,
        )  # fmt: skip
        try:
            for name in rest:
                unload(sim.url, name)
        except Exception:
            sim.proc.close()
            raise
        return sim.url, sim.proc

    with started_in_parallel(spec.replicas, start) as urls:
        yield urls


def placement_summary(
    loop: PlacementLoop, initial: Mapping[str, tuple[str, ...]], hot: str, shift_at_s: float
) -> dict[str, Any]:
    """What the placement loop did: moves, the new hot adapter's k and its convergence time."""
    k = loop.state[hot].k if hot in loop.state else 0
    holders = holders_over_time(initial.get(hot, ()), loop.moves, hot)
    decided = [(t, kk) for t, a, kk in loop.k_changes if a == hot and t >= shift_at_s]
    ks = Counter(st.k for st in loop.state.values())
    return {
        "hot_after_k": k,
        "hot_after_initial_holders": len(initial.get(hot, ())),
        "hot_after_holders": [[t, c] for t, c in holders if t > -math.inf],
        "hot_after_k_changes": decided,
        "convergence_s": convergence_s(holders, k, shift_at_s) if k else None,
        "placement_loads": sum(1 for m in loop.moves if m.kind == "load"),
        "placement_unloads": sum(1 for m in loop.moves if m.kind == "unload"),
        "placement_failed_calls": loop.failed_calls[:20],
        "k_histogram": {str(kk): c for kk, c in sorted(ks.items())},
        "slowest_replicas": loop.busiest,
        "request_rates": loop.rates,  # per step: (time, pool req/s, the 3 most requested with their req/s)
    }


TIME_SCALE = 8.0  # wall seconds per simulated second: 16 replicas on 2 shared cores (METHOD.md)


def catalog_scenario(
    *, rate_rps: float = 200.0, duration_s: float = 24.0, shift_at_s: float = 10.0, time_scale: float = TIME_SCALE,
    replicas: int = 16, adapters: int = 1000, max_cpu_loras: int = 96, output_tokens: tuple[int, int] = (8, 16),
) -> CatalogScenario:  # fmt: skip
    """Regime (e): ``adapters`` Zipf(1.0) over ``replicas`` with a CPU cache of ``max_cpu_loras`` each."""
    fleet = FleetSpec(
        replicas=replicas, adapters=adapters, max_loras=4, max_cpu_loras=max_cpu_loras, time_scale=time_scale
    )
    workload = Workload(
        rate_rps=rate_rps, duration_s=duration_s, adapters=adapters, popularity="zipf",
        prompt_tokens=(64, 512), output_tokens=output_tokens, seed=7,
    )  # fmt: skip
    about = (
        f"{adapters} adapters over {replicas} replicas, Zipf 1.0 with a new hot set at {shift_at_s:g} s,"
        f" CPU cache {max_cpu_loras}/replica, Poisson {rate_rps:g} req/s"
    )
    return CatalogScenario("e-zipf-shift", about, fleet, workload, shift_at_s)


SYSTEMS: tuple[System, ...] = (
    System(PLACEMENT, "lorapool", "affinity"),
    System("lorapool affinity", "lorapool", "affinity"),
    System(CONSISTENT_HASH, "vllm-router", "consistent_hash"),
    System("lorapool round-robin", "lorapool", "round-robin"),
    # the second front door over the same all-replica fleet: its goodput against lorapool affinity's (issue 24)
    System(ENVOY_PICKER, "envoy-picker", "affinity"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """A pilot run outside results.json (``bench/run.py --large-catalog`` makes the real one)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--systems", default="")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=24.0)
    parser.add_argument("--shift", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=TIME_SCALE)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--cpu-loras", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("/tmp/large-catalog-pilot.json"))
    args = parser.parse_args(argv)
    s = catalog_scenario(
        rate_rps=args.rate, duration_s=args.duration, shift_at_s=args.shift, time_scale=args.scale,
        replicas=args.replicas, adapters=args.adapters, max_cpu_loras=args.cpu_loras,
    )  # fmt: skip
    root = Path(os.environ.get("BENCH_ADAPTERS", "/tmp/lorapool-bench-adapters"))
    runs = []
    for system in SYSTEMS:
        if args.systems and system.name not in args.systems.split(","):
            continue
        cell = run_cell(s, system, root)
        runs.append(cell)
        shown = {k: v for k, v in cell.items() if k not in ("goodput_timeline", "hot_after_holders")}
        print(json.dumps(shown, default=str), flush=True, file=sys.stderr)
    args.out.write_text(json.dumps({"scenario": scenario_dict(s), "runs": runs}, indent=1, default=str))
    return 0


def run(out: Path, adapter_root: Path, stamp: dict[str, str], systems: Sequence[str] = ()) -> dict[str, Any]:
    """Measure the systems of regime (e) (all when ``systems`` is empty) and fold the cells into
    OUT/results.json (``results.merge``: a cell measured again replaces the old one; a fresh OUT starts empty)."""
    s = catalog_scenario()
    fresh: dict[str, Any] = {"scenarios": [scenario_dict(s)], "runs": []}
    partial = out / "large_catalog.partial.json"
    for system in SYSTEMS:
        if systems and system.name not in systems:
            continue
        try:
            cell = run_cell(s, system, adapter_root)
        except Exception as exc:  # a system that fails to start is reported, not fatal
            cell = {"scenario": s.name, "system": system.name, "error": repr(exc)[:500]}
        cell["date"] = stamp["date"]
        fresh["runs"].append(cell)
        print(json.dumps({k: v for k, v in cell.items() if k not in ("goodput_timeline",)}, default=str), flush=True)
        partial.write_text(json.dumps(fresh, indent=1, default=str))
    data = results.merge(results.load(out, stamp), fresh, stamp)
    data["scenarios"] = [d for d in data["scenarios"] if d["name"] != s.name] + fresh["scenarios"]
    results.save(out, data)
    partial.unlink(missing_ok=True)
    return data


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
