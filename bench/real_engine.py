"""The real-engine cell: affinity vs round-robin on vLLM CPU replicas, beside the simulator's prediction.

    python bench/run.py --real-engine          # ~8 min: writes bench/results/real_engine.json, then RESULTS.md

One small scenario (``SCENARIO``): 2 replicas, ``--max-loras 2``, 8 rank-8 adapters (more
adapters than the fleet's 4 slots), a seeded open-loop Poisson schedule. Each system runs on
fresh replicas twice over: on real ``vllm serve`` (CPU, the tiny Llama, one core per replica)
and on ``lorapool sim`` with the same flags and the same schedule. The simulator models an A100
serving Llama-3-8B, not the tiny model on a CPU, so absolute times differ by design; what the
cell compares is what the simulator is used for: how the systems rank. Per engine: LoRA loads
per 1k requests and the affinity / round-robin ratios of loads and of TTFT p50/p99.

Loads on vLLM are counted from its own log: ``vllm.lora.model_manager`` logs "Activating LoRA"
at DEBUG each time an adapter takes a LoRA slot (a logging config turns on DEBUG for that
logger only). On the simulator: ``sim:lora_loads_total`` (into a slot, from CPU or disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.loadgen import Workload, adapter_name, noisy_schedule, per_adapter, run_open_loop, summarize
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN, SYSTEMS, Scenario
from bench.systems import FleetSpec, System

RESULTS_FILE = "real_engine.json"
ACTIVATION_LINE = "Activating LoRA"
SCENARIO = Scenario(
    "real-2x2-8-poisson",
    "real",
    "2 replicas x --max-loras 2, 8 adapters (uniform), Poisson 6 req/s for 60 s, 10 s warm-up",
    FleetSpec(replicas=2, adapters=8, max_loras=2, max_cpu_loras=8, time_scale=1.0),
    Workload(
        rate_rps=6.0, duration_s=60.0, adapters=8, prompt_tokens=(8, 40), output_tokens=(8, 32), seed=7
    ),  # prompts of 8-40 words stay well inside the tiny model's 512 tokens
    warmup_s=10.0,
    slo_ttft_s=0.5,
)
COMPARED = (LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN)
# vLLM's logging: its usual INFO lines, plus DEBUG from the LoRA model manager only.
LOGGING_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(asctime)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stdout"}},
    "loggers": {
        "vllm": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "vllm.lora.model_manager": {"level": "DEBUG"},
    },
}


def systems() -> list[System]:
    return [s for s in SYSTEMS if s.name in COMPARED]


@contextlib.contextmanager
def vllm_fleet(spec: FleetSpec, adapter_root: Path) -> Iterator[tuple[list[str], Callable[[], float]]]:
    """Fresh vLLM CPU replicas serving ``spec.adapters`` tiny-model adapters (``lora-0000`` ...);
    yields their URLs and a function counting LoRA slot activations so far (from their logs)."""
    from lorapool_dev.engine.install import require_engine
    from lorapool_dev.engine.replicas import replica_configs, start_engines, stop_engines
    from lorapool_dev.engine.server import ServeConfig
    from lorapool_dev.engine.tinymodel import ensure_tiny_model, write_tiny_adapter

    install = require_engine()
    modules = []
    for i in range(spec.adapters):
        path = adapter_root / adapter_name(i)
        if not (path / "adapter_config.json").exists():
            write_tiny_adapter(path, rank=8, seed=i)
        modules.append((adapter_name(i), str(path)))
    template = ServeConfig(
        model=str(ensure_tiny_model(engine=install)), port=0, max_loras=spec.max_loras, max_lora_rank=8,
        max_cpu_loras=spec.max_cpu_loras, lora_modules=tuple(modules), max_num_seqs=spec.max_num_seqs,
        seed=spec.seed,
    )  # fmt: skip
    cfgs = replica_configs(template, spec.replicas)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(LOGGING_CONFIG, f)
    previous = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = f.name  # start_process adds its env to ours
    try:
        procs = start_engines("vllm", cfgs, install=install)
    finally:
        if previous is None:
            os.environ.pop("VLLM_LOGGING_CONFIG_PATH", None)
        else:
            os.environ["VLLM_LOGGING_CONFIG_PATH"] = previous
        Path(f.name).unlink(missing_ok=True)
    try:

        def activations() -> float:
            return float(sum(p.output().count(ACTIVATION_LINE) for p in procs))

        yield [c.url for c in cfgs], activations
    finally:
        stop_engines(procs)


@contextlib.contextmanager
def sim_fleet(spec: FleetSpec, adapter_root: Path) -> Iterator[tuple[list[str], Callable[[], float]]]:
    """The same fleet as simulators; loads counted by ``sim:lora_loads_total``."""
    from bench.systems import sim_fleet as start_sims
    from lorapool_dev.testing.scrape import samples, scrape

    with start_sims(spec, adapter_root) as urls:

        def loads() -> float:
            return sum(
                value for url in urls for _, value in samples(scrape(url, timeout_s=10)).get("sim:lora_loads_total", [])
            )

        yield urls, loads


def measure(urls: list[str], loads: Callable[[], float], system: System, scenario: Scenario) -> dict[str, Any]:
    """Replay the scenario's schedule (with its flood, if any) through ``system``; count what was sent after
    the warm-up, in all and per adapter."""
    plan = noisy_schedule(scenario.workload)
    spec = scenario.fleet

    async def go() -> tuple[Any, float, float]:
        at_warmup: list[float] = []

        async def snapshot() -> None:
            await asyncio.sleep(scenario.warmup_s)
            at_warmup.append(await asyncio.to_thread(loads))

        snap = asyncio.create_task(snapshot())
        result = await run_open_loop(url, plan, drain_timeout_s=60.0)
        await snap
        return result, at_warmup[0], await asyncio.to_thread(loads)

    with system.start(urls, max_cpu_loras=spec.max_cpu_loras, time_scale=spec.time_scale) as url:
        result, before, after = asyncio.run(go())
    result.outcomes = [o for o in result.outcomes if o.sent_s >= scenario.warmup_s]
    window = scenario.workload.duration_s - scenario.warmup_s
    summary = summarize(result, window_s=window, slo_ttft_s=scenario.slo_ttft_s)
    summary["loads_per_1k"] = 1000.0 * (after - before) / max(1, summary["requests"])
    summary["per_adapter"] = per_adapter(result.outcomes, window_s=window, slo_ttft_s=scenario.slo_ttft_s)
    return summary


def ratios(runs: list[dict[str, Any]], engine: str) -> dict[str, float | None]:
    """Affinity / round-robin on one engine: loads per 1k, TTFT p50 and p99. Pure."""
    by = {r["system"]: r for r in runs if r["engine"] == engine and "error" not in r}
    a, b = by.get(LORAPOOL_AFFINITY), by.get(LORAPOOL_ROUND_ROBIN)
    out: dict[str, float | None] = {}
    for key in ("loads_per_1k", "ttft_p50_s", "ttft_p99_s"):
        num, den = (a or {}).get(key), (b or {}).get(key)
        out[key] = num / den if isinstance(num, float | int) and isinstance(den, float | int) and den else None
    return out


def run(out: Path, adapter_root: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """Measure the cell on both engines and write ``out/real_engine.json``."""
    fleets = {"vllm": vllm_fleet, "sim": sim_fleet}
    runs: list[dict[str, Any]] = []
    for engine, fleet in fleets.items():
        for system in systems():
            started = time.monotonic()
            try:
                root = adapter_root / ("tiny" if engine == "vllm" else "sim")
                with fleet(SCENARIO.fleet, root) as (urls, loads):
                    summary = measure(urls, loads, system, SCENARIO)
            except Exception as exc:  # reported in the file, not fatal
                summary = {"error": repr(exc)[:500]}
            summary.update(engine=engine, system=system.name, wall_s=time.monotonic() - started)
            runs.append(summary)
            print(json.dumps(summary, default=str), flush=True)
    data = {
        **stamp,
        "scenario": {
            "name": SCENARIO.name,
            "about": SCENARIO.about,
            "fleet": dataclasses.asdict(SCENARIO.fleet),
            "workload": dataclasses.asdict(SCENARIO.workload),
            "warmup_s": SCENARIO.warmup_s,
        },
        "runs": runs,
        "ratios": {engine: ratios(runs, engine) for engine in fleets},
    }
    (out / RESULTS_FILE).write_text(json.dumps(data, indent=1, default=str))
    return data


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def section(results_dir: Path) -> list[str]:
    """RESULTS.md's real-engine section from ``real_engine.json``; nothing when it was never measured."""
    path = results_dir / RESULTS_FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = [
        "## The real engine beside the simulator",
        "",
        f"`{data['command']}` on {data['date']} ({data['machine']}). Scenario {data['scenario']['about']}.",
        "Each system on fresh replicas of each engine, the same seeded schedule: real `vllm serve` (CPU build"
        " 0.32, the tiny Llama, one core per replica) and `lorapool sim` (its A100 / Llama-3-8B cost model)"
        " with the same flags. Absolute times differ by design; the ratios are what the simulator predicts.",
        "",
        "| engine | system | requests | failed | LoRA loads / 1k req | TTFT p50 | TTFT p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['system']} | error: {r['error'][:120]} | | | | |")
            continue
        lines.append(
            f"| {r['engine']} | {r['system']} | {r['requests']} | {r['failed']} | {r['loads_per_1k']:.0f} |"
            f" {1000 * r['ttft_p50_s']:.0f} ms | {1000 * r['ttft_p99_s']:.0f} ms |"
        )
    v, s = data["ratios"]["vllm"], data["ratios"]["sim"]
    lines += [
        "",
        "Affinity / round-robin (below 1: affinity better):",
        "",
        "| ratio | vLLM CPU (measured) | simulator (predicted) |",
        "|---|---|---|",
    ]
    for key, label in (("loads_per_1k", "LoRA loads per 1k"), ("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99")):
        lines.append(f"| {label} | {_x(v.get(key))} | {_x(s.get(key))} |")
    lines += ["", fidelity(data["runs"]), ""]
    return lines


def fidelity(runs: list[dict[str, Any]]) -> str:
    """One sentence: the simulator's LoRA loads per 1k as a multiple of vLLM's, per system. Pure."""
    loads = {(r["engine"], r["system"]): r.get("loads_per_1k") for r in runs if "error" not in r}
    parts = []
    for system in COMPARED:
        sim, real = loads.get(("sim", system)), loads.get(("vllm", system))
        parts.append(f"{system} {_x(sim / real if sim is not None and real else None)}")
    return "Simulator's LoRA loads per 1k requests as a multiple of vLLM's: " + ", ".join(parts) + "."
