"""Issue 15's cell: --max-loras sized statically, by the closed loop, and by a hand-picked sweep.

    python bench/run.py --sizing        # both workloads, ~2-4 min on one core

One simulated replica (``lorapool.sim.engine`` on its virtual clock: no processes, no wall-clock
noise, seeded) of Llama-3-8B on an A100-80GB serves a catalog of 320 rank-16 adapters. Its KV
cache is what vLLM would leave after weights, reserve and the LoRA buffers of ``max_loras``
slots at rank 16 (``sim.timing.kv_cache_tokens``: each slot takes ~92 MB = 704 tokens of KV
cache), so slots are bought with KV cache exactly as on the GPU. Workloads on the same catalog,
all open loop (Poisson), long generations (prompts 500-1500, outputs 1000-3000 tokens) so that
KV cache is what a batch runs short of:

- ``zipf``: popularity Zipf(1.2), a handful of adapters hot, 2 req/s;
- ``uniform``: every adapter equally likely, many distinct adapters in flight at once, 2 req/s;
- ``zipf-kv-short``: Zipf at 2.2 req/s, where 134 slots leave too little KV cache;
- ``zipf-past-the-knee``: Zipf at 2.3 req/s, a preemption storm at the default.

Rows: ``static (auto, catalog)``, auto before issue 15 (a slot per adapter, capped at maxNumSeqs
= 256); ``static (auto, concurrency)``, auto since issue 15 (``plan.sizing.estimate_concurrency``);
``tuned``, the closed loop from the concurrency default: each round runs the workload, samples
the engine every 0.5 s as the sidecar samples /metrics (``sidecar.observations``, as vLLM 0.32
shows it: the running batch's adapters only, waiting count, KV usage), closes 10 s windows,
pools them and asks ``plan.sizing.recommend`` (p95 distinct adapters x 1.25, grown when requests
wait with every slot busy and KV free, stepped down while KV runs short, capped as the plan is),
moves by at most x2 per round (``spec.lora.tuning.maxStepFactor``'s default) and keeps the
previous value when p99 TTFT or goodput got worse by more than 10 % (the rollback margin); it
stops when the recommendation says Keep. ``sweep``: every value of ``SWEEP``; the best by goodput
is the oracle. Goodput = requests with TTFT <= ``SLO_TTFT_S`` per simulated second of the
measured window (arrivals after warm-up; a request not finished counts as a miss).

Pure parts (schedules, the sampler, the summary, the tuning rule, the section) are tested in
tests/bench/test_sizing.py.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lorapool.api.models import LoRAPool
from lorapool.api.report import Observations
from lorapool.plan.planner import AdapterRank, Plan, plan_pool
from lorapool.plan.sizing import Action, SlotBounds, pool_evidence, recommend
from lorapool.sidecar.observations import Sample, Window
from lorapool.sim.engine import AdapterRef, Engine, EngineConfig, SimRequest
from lorapool.sim.timing import PROFILES, kv_cache_tokens

RESULTS = "sizing.json"
CATALOG = 320
RANK = 16
PROFILE = "a100-llama3-8b"
SWEEP = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SLO_TTFT_S = 2.0
SAMPLE_S = 0.5  # the sidecar's scrape period (simulated seconds)
WINDOW_S = 10.0  # the sidecar's window (simulated seconds)
ROLLBACK_MARGIN = 0.10
MAX_STEP = 2.0
MAX_ROUNDS = 6
WITHIN = 0.10  # issue 15's target: tuned within 10 % of the sweep's best goodput


@dataclass(frozen=True)
class SizingWorkload:
    name: str
    about: str
    popularity: str  # "zipf" or "uniform"
    rate_rps: float
    duration_s: float
    zipf_s: float = 1.2
    prompt_tokens: tuple[int, int] = (500, 1500)
    output_tokens: tuple[int, int] = (1000, 3000)
    warmup_s: float = 60.0
    seed: int = 15


WORKLOADS = (
    SizingWorkload("zipf", "Zipf(1.2) over 320 adapters: a handful hot", "zipf", rate_rps=2.0, duration_s=300.0),
    SizingWorkload("uniform", "uniform over 320 adapters: many in flight", "uniform", rate_rps=2.0, duration_s=300.0),
    SizingWorkload(
        "zipf-kv-short", "Zipf(1.2), 10 % more load: the KV cache runs short", "zipf", rate_rps=2.2, duration_s=300.0
    ),
    SizingWorkload(
        "zipf-past-the-knee", "Zipf(1.2), 15 % more load: preemption storm", "zipf", rate_rps=2.3, duration_s=300.0
    ),
)


# --- pure: the schedule ----------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    t: float
    adapter: int
    prompt_tokens: int
    output_tokens: int


def weights(w: SizingWorkload, n: int = CATALOG) -> list[float]:
    if w.popularity == "uniform":
        return [1.0] * n
    return [1.0 / (i + 1) ** w.zipf_s for i in range(n)]


def schedule(w: SizingWorkload, n: int = CATALOG) -> list[Arrival]:
    """Poisson arrivals over ``duration_s``, adapters by popularity; the same for every max-loras."""
    rng = random.Random(w.seed)
    ws = weights(w, n)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(w.rate_rps)
        if t >= w.duration_s:
            return out
        adapter = rng.choices(range(n), ws)[0]
        out.append(Arrival(t, adapter, rng.randint(*w.prompt_tokens), rng.randint(*w.output_tokens)))


# --- pure: what the sidecar would see ----------------------------------------------------------


def sample(engine: Engine, max_loras: int) -> Sample:
    """The engine as vLLM 0.32 and 0.34 show it: lora_requests_info lists the running batch's
    adapters only (tests/engine/test_observations_real.py), not those whose requests wait."""
    return Sample(
        running=engine.num_running,
        waiting=engine.num_waiting,
        kv_usage=engine.kv_cache_usage,
        preemptions_total=float(engine.stats.preemptions),
        max_loras=max_loras,
        inflight=frozenset(engine.listed_adapter_names()),
    )


# --- the run ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    max_loras: int
    kv_tokens: int
    goodput: float
    ttft_p50_s: float
    ttft_p99_s: float
    completed: int
    measured: int
    preemptions: int
    loads: int
    windows: list[Observations] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("windows")
        return d


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def simulate(w: SizingWorkload, max_loras: int, arrivals: Sequence[Arrival]) -> RunResult:
    """Run the schedule on one simulated replica with ``max_loras`` slots; sample it as a sidecar would."""
    profile = PROFILES[PROFILE]
    tokens = kv_cache_tokens(
        profile, gpu_memory_utilization=0.9, enable_lora=True, max_loras=max_loras, max_lora_rank=RANK
    )
    config = EngineConfig(
        num_gpu_blocks=tokens // 16,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        max_model_len=profile.max_model_len,
        enable_lora=True,
        max_loras=max_loras,
        max_lora_rank=RANK,
        max_cpu_loras=max(CATALOG, max_loras),
    )
    engine = Engine(config, profile.timing)
    refs = [AdapterRef(i + 1, f"a{i:03d}", RANK, f"/adapters/a{i:03d}") for i in range(CATALOG)]
    for ref in refs:  # registered at start-up (the CPU cache holds the catalog), as the sidecar loads them
        engine.load_adapter(ref)
    engine.clock_s = 0.0
    start_loads = sum(engine.stats.loads.values())
    start_preemptions = engine.stats.preemptions
    requests = [
        SimRequest(f"r{i}", a.prompt_tokens, a.output_tokens, adapter=refs[a.adapter]) for i, a in enumerate(arrivals)
    ]
    window = Window(window_s=WINDOW_S, max_gap_s=WINDOW_S)
    windows: list[Observations] = []
    next_sample = 0.0
    pending = 0
    deadline = w.duration_s + 60.0
    while (pending < len(requests) or engine.has_work) and engine.clock_s < deadline:
        while pending < len(requests) and arrivals[pending].t <= engine.clock_s:
            requests[pending].arrival_s = arrivals[pending].t
            engine.add_request(requests[pending])
            pending += 1
        while next_sample <= engine.clock_s:
            if (closed := window.add(sample(engine, max_loras), next_sample)) is not None:
                windows.append(closed)
            next_sample += SAMPLE_S
        if not engine.has_work:
            engine.clock_s = arrivals[pending].t
            continue
        engine.step()
    measured = [r for r in requests if r.arrival_s >= w.warmup_s]
    ttfts = [r.first_token_s - r.arrival_s if r.first_token_s >= 0 else math.inf for r in measured]
    good = sum(1 for t in ttfts if t <= SLO_TTFT_S)
    span = w.duration_s - w.warmup_s
    return RunResult(
        max_loras=max_loras,
        kv_tokens=tokens,
        goodput=good / span,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        completed=sum(1 for r in measured if r.finished_s >= 0),
        measured=len(measured),
        preemptions=engine.stats.preemptions - start_preemptions,
        loads=sum(engine.stats.loads.values()) - start_loads,
        windows=[o for o in windows if o.end - o.window_s >= w.warmup_s],
    )


# --- pure: the tuning rule -------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    max_loras: int
    goodput: float
    ttft_p99_s: float
    action: str
    recommended: int
    evidence: str


def worse(after: RunResult, before: RunResult, margin: float = ROLLBACK_MARGIN) -> bool:
    """The operator's rollback rule: p99 TTFT up or goodput down by more than ``margin``."""
    return after.ttft_p99_s > before.ttft_p99_s * (1 + margin) or after.goodput < before.goodput * (1 - margin)


def bounded(current: int, target: int, factor: float = MAX_STEP) -> int:
    low, high = max(1, math.ceil(current / factor)), max(current + 1, math.floor(current * factor))
    return min(max(target, low), high)


def tune(start: int, bounds: SlotBounds, run: Callable[[int], RunResult]) -> tuple[RunResult, list[Round]]:
    """The closed loop, one workload run per period: recommend, bounded step, roll back if worse."""
    current = run(start)
    rounds: list[Round] = []
    for _ in range(MAX_ROUNDS):
        rec = recommend(pool_evidence(current.windows), SlotBounds(**{**asdict(bounds), "current": current.max_loras}))
        rounds.append(
            Round(current.max_loras, current.goodput, current.ttft_p99_s, rec.action.value, rec.max_loras, rec.evidence)
        )
        if rec.action not in (Action.GROW, Action.SHRINK):
            break
        candidate = run(bounded(current.max_loras, rec.max_loras))
        if worse(candidate, current):
            rounds.append(
                Round(candidate.max_loras, candidate.goodput, candidate.ttft_p99_s, "RolledBack", current.max_loras, "")
            )
            break
        current = candidate
    return current, rounds


# --- the cell --------------------------------------------------------------------------------


def catalog_plan(**lora: Any) -> Plan:
    pool = LoRAPool.model_validate(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "bench", "namespace": "bench"},
            "spec": {
                "baseModel": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": "hf://meta-llama/x"},
                "gpu": {"product": "A100-80GB"},
                "lora": lora,
            },
        }
    )
    return plan_pool(pool.spec, [AdapterRank(f"a{i:03d}", f"spec.adapters[{i}]", RANK) for i in range(CATALOG)])


def measure(w: SizingWorkload) -> dict[str, Any]:
    arrivals = schedule(w)
    cache: dict[int, RunResult] = {}

    def run(max_loras: int) -> RunResult:
        if max_loras not in cache:
            cache[max_loras] = simulate(w, max_loras, arrivals)
        return cache[max_loras]

    auto = catalog_plan()
    assert auto.slots is not None
    catalog_auto = min(CATALOG, auto.slots.max_slots)  # auto before issue 15: a slot per adapter, <= maxNumSeqs
    tuned, rounds = tune(auto.max_loras, auto.slots, run)
    sweep = [run(v).row() for v in SWEEP]
    return {
        "workload": asdict(w),
        "requests": len(arrivals),
        "static_catalog": run(catalog_auto).row(),
        "static_concurrency": run(auto.max_loras).row(),
        "concurrency": asdict(auto.concurrency) if auto.concurrency else None,
        "tuned": tuned.row(),
        "rounds": [asdict(r) for r in rounds],
        "sweep": sweep,
    }


def run(out: Path, stamp: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    data = {
        **stamp,
        "slo_ttft_s": SLO_TTFT_S,
        "workloads": [measure(w) for w in WORKLOADS],
    }
    data["wall_s"] = round(time.monotonic() - started, 1)
    (out / RESULTS).write_text(json.dumps(data, indent=1, default=str))
    return data


def load(results_dir: Path) -> dict[str, Any] | None:
    path = results_dir / RESULTS
    return json.loads(path.read_text()) if path.exists() else None


# --- pure: the report ------------------------------------------------------------------------


def best(cell: dict[str, Any]) -> dict[str, Any]:
    """The sweep's best point: highest goodput, then lowest p99 TTFT."""
    return max(cell["sweep"], key=lambda r: (r["goodput"], -r["ttft_p99_s"]))


def tuned_share(cell: dict[str, Any]) -> float:
    """Tuned goodput as a share of the sweep's best (1.0 = as good)."""
    top = best(cell)["goodput"]
    return cell["tuned"]["goodput"] / top if top > 0 else math.nan


def _row(name: str, r: dict[str, Any]) -> str:
    p99 = "inf" if math.isinf(r["ttft_p99_s"]) else f"{r['ttft_p99_s']:.2f}"
    return (
        f"| {name} | {r['max_loras']} | {r['kv_tokens']:,} | {r['goodput']:.2f} | {p99} | "
        f"{r['completed']}/{r['measured']} | {r['preemptions']} | {r['loads']} |"
    )


def section(data: dict[str, Any] | None) -> list[str]:
    """RESULTS.md's sizing section (issue 15), from sizing.json."""
    if not data:
        return []
    lines = [
        "## Sizing --max-loras: static, tuned, sweep (issue 15)",
        "",
        f"Measured {data.get('date', '?')} with `{data.get('command', 'python bench/run.py --sizing')}` "
        f"({data.get('wall_s', '?')} s wall). One simulated A100-80GB replica of Llama-3-8B, 320 rank-16 "
        "adapters, on the simulator's virtual clock (no time scale: numbers are simulated seconds); each slot's "
        "LoRA buffer is taken from the KV cache (704 tokens per slot). Goodput = requests with TTFT <= "
        f"{data.get('slo_ttft_s')} s per second after warm-up. How the rows are made: bench/sizing.py.",
        "",
    ]
    for cell in data["workloads"]:
        w = cell["workload"]
        top = best(cell)
        lines += [
            f"### {w['name']}: {w['about']} ({w['rate_rps']} req/s, {cell['requests']} requests, prompts "
            f"{w['prompt_tokens'][0]}-{w['prompt_tokens'][1]} tokens)",
            "",
            "| row | max-loras | KV tokens | goodput (req/s) | p99 TTFT (s) | completed | preemptions | slot loads |",
            "|---|---|---|---|---|---|---|---|",
            _row("static (auto, catalog: before issue 15)", cell["static_catalog"]),
            _row("static (auto, concurrency estimate)", cell["static_concurrency"]),
            _row("tuned (closed loop from the estimate)", cell["tuned"]),
            *(_row("sweep" + (" (best)" if r == top else ""), r) for r in cell["sweep"]),
            "",
            f"Tuned reaches {tuned_share(cell):.0%} of the sweep's best goodput (target: within {WITHIN:.0%}). "
            "Its rounds: "
            + "; ".join(f"{r['max_loras']} -> {r['action']} {r['recommended']}" for r in cell["rounds"])
            + ".",
            "",
        ]
    return lines
