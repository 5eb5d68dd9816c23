"""The real-engine fairness cell (issue 27): a flood beside two well-behaved adapters on vLLM CPU.

    python bench/run.py --real-engine-fair     # ~10 min: bench/results/real_engine_fair.json, then RESULTS.md

Regime (f) in miniature, on real ``vllm serve`` replicas (CPU, the tiny Llama, one core each):
2 replicas x ``--max-loras 2``, 3 adapters sending an equal Poisson share; in the flood run one of
them also sends 10x its share in 1-s bursts every 4 s (``loadgen.flood_schedule``: the other
arrivals are the very same in both runs). ``lorapool fair`` (fair dispatch and the prefill cap,
as the pool's ``spec.router.dispatch`` renders them) beside ``lorapool affinity`` (neither), each
system on fresh replicas for each run, so no run inherits another's prefix cache. Judged as
regime (f) is, adapter by adapter (``fairness_report``): each well-behaved adapter's p99 TTFT
in the flood over its own without it, the flood's throughput over its max-min share, and fair
dispatch's goodput beside affinity's. The simulator is not run beside it: its A100 cost model
would not be saturated by a load a CPU replica is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from bench.fairness_report import max_min_share, worst_p99_ratio
from bench.loadgen import Workload, adapter_name
from bench.real_engine import measure, vllm_fleet
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_FAIR, SYSTEMS, Scenario
from bench.systems import FleetSpec, System

RESULTS_FILE = "real_engine_fair.json"
FLOOD = adapter_name(0)
FLEET = FleetSpec(replicas=2, adapters=3, max_loras=2, max_cpu_loras=3, time_scale=1.0)
RATE_RPS = 6.0
COMPARED = (LORAPOOL_FAIR, LORAPOOL_AFFINITY)


def _scenario(name: str, flood: str, about: str) -> Scenario:
    work = Workload(
        rate_rps=RATE_RPS, duration_s=60.0, adapters=FLEET.adapters, prompt_tokens=(8, 40), output_tokens=(8, 32),
        seed=13, flood=flood, flood_factor=10.0,
    )  # fmt: skip  # prompts of 8-40 words stay well inside the tiny model's 512 tokens
    return Scenario(name, "real-f", about, FLEET, work, warmup_s=10.0, slo_ttft_s=0.5)


QUIET = _scenario(
    "real-f-quiet", "", f"2 replicas x --max-loras 2, 3 adapters (uniform), Poisson {RATE_RPS:g} req/s for 60 s"
)
FLOODED = _scenario(
    "real-f-flood", FLOOD, f"as real-f-quiet, and {FLOOD} floods: 10x its share in 1-s bursts every 4 s"
)
SCENARIOS = (QUIET, FLOODED)


def systems() -> list[System]:
    return [s for s in SYSTEMS if s.name in COMPARED]


def run(out: Path, adapter_root: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """Measure each system on each scenario, on fresh vLLM replicas; write ``out/real_engine_fair.json``."""
    runs: list[dict[str, Any]] = []
    for scenario in SCENARIOS:
        for system in systems():
            started = time.monotonic()
            try:
                with vllm_fleet(scenario.fleet, adapter_root) as (urls, loads):
                    summary = measure(urls, loads, system, scenario)
            except Exception as exc:  # reported in the file, not fatal
                summary = {"error": repr(exc)[:500]}
            summary.update(scenario=scenario.name, system=system.name, wall_s=time.monotonic() - started)
            runs.append(summary)
            print(json.dumps(summary, default=str), flush=True)
    data = {
        **stamp,
        "scenarios": [
            {"name": s.name, "about": s.about, "workload": dataclasses.asdict(s.workload), "warmup_s": s.warmup_s}
            for s in SCENARIOS
        ],
        "fleet": dataclasses.asdict(FLEET),
        "runs": runs,
        "verdicts": verdicts(runs),
    }
    (out / RESULTS_FILE).write_text(json.dumps(data, indent=1, default=str))
    return data


def _by(runs: list[dict[str, Any]], scenario: str) -> dict[str, dict[str, Any]]:
    return {r["system"]: r for r in runs if r.get("scenario") == scenario and "per_adapter" in r}


def verdicts(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per system: the worst well-behaved p99 ratio (flood / quiet) and whose, the flood's throughput
    over its max-min share, and goodput in the flood run over affinity's. Pure."""
    quiet, flood = _by(runs, QUIET.name), _by(runs, FLOODED.name)
    base = flood.get(LORAPOOL_AFFINITY)
    out: dict[str, dict[str, Any]] = {}
    for system, f in flood.items():
        adapters = f["per_adapter"]
        window = f["completed"] / f["throughput_rps"] if f["throughput_rps"] > 0 else math.nan
        demands = {m: a["requests"] / window for m, a in adapters.items()}
        share = max_min_share(demands, f["throughput_rps"], FLOOD)
        worst, who = worst_p99_ratio(quiet[system], f, FLOOD) if system in quiet else (math.nan, "")
        out[system] = {
            "worst_p99_ratio": worst,
            "worst_adapter": who,
            "flood_share": adapters.get(FLOOD, {}).get("throughput_rps", 0.0) / share if share > 0 else math.nan,
            "goodput_vs_affinity": f["goodput_rps"] / base["goodput_rps"] if base and base["goodput_rps"] > 0 else None,
        }
    return out


def _ms(seconds: float) -> str:
    return "failed" if not math.isfinite(seconds) else f"{1000 * seconds:.0f} ms"


def section(results_dir: Path) -> list[str]:
    """RESULTS.md's section from ``real_engine_fair.json``; nothing when it was never measured."""
    path = results_dir / RESULTS_FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    well = [adapter_name(i) for i in range(data["fleet"]["adapters"]) if adapter_name(i) != FLOOD]
    lines = [
        "## Fair dispatch on the real engine (issue 27)",
        "",
        f"`{data['command']}` on {data['date']} ({data['machine']}). {data['scenarios'][0]['about']};"
        f" in {FLOODED.name} {FLOOD} also sends 10x its share in 1-s bursts every 4 s (the other arrivals"
        " the same). Each run on fresh `vllm serve` replicas (CPU build, the tiny Llama, one core each).",
        "",
        "| scenario | system | requests | failed | goodput req/s | "
        + " | ".join(f"{m} p99 TTFT" for m in [FLOOD, *well])
        + " |",
        "|---|---|---|---|---|" + "---|" * (1 + len(well)),
    ]
    for r in data["runs"]:
        if "error" in r:
            lines.append(f"| {r['scenario']} | {r['system']} | error: {r['error'][:120]} |")
            continue
        p99 = [_ms(r["per_adapter"].get(m, {}).get("ttft_p99_s", math.nan)) for m in [FLOOD, *well]]
        lines.append(
            f"| {r['scenario']} | {r['system']} | {r['requests']} | {r['failed']} | {r['goodput_rps']:.2f} | "
            + " | ".join(p99)
            + " |"
        )
    lines += [
        "",
        "| system | worst well-behaved p99, flood / quiet | flood's throughput / its max-min share |"
        " goodput in the flood / affinity's |",
        "|---|---|---|---|",
    ]
    for system, v in data["verdicts"].items():
        ratio = v["goodput_vs_affinity"]
        lines.append(
            f"| {system} | {v['worst_p99_ratio']:.2f}x ({v['worst_adapter']}) | {v['flood_share']:.2f}x |"
            f" {'n/a' if ratio is None else f'{ratio:.2f}x'} |"
        )
    return [*lines, ""]
