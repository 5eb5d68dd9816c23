"""Run the routing benchmark and write bench/RESULTS.md plus plots.

    python bench/run.py --out bench/results            # everything (about an hour on 2 cores)
    python bench/run.py --out /tmp/r --only a-uniform-poisson --systems "lorapool affinity"
    python bench/run.py --merge --skip-overhead --only c-uniform-poisson   # re-measure some cells
    python bench/run.py --report-only                  # rewrite RESULTS.md from results.json
    python bench/run.py --real-engine                  # the vLLM CPU cell (bench/real_engine.py), ~8 min
    python bench/run.py --real-engine-fair             # fair dispatch on vLLM CPU (bench/real_engine_fair.py), ~10 min
    python bench/run.py --regime-b-seeds               # regime (b), 3 seeds x fair, affinity, oracle (bench/seeds.py), ~9 min
    python bench/run.py --large-catalog                # regime (e) (bench/large_catalog.py): 5 systems, ~19 min
    python bench/run.py --chaos                        # the chaos cell (bench/chaos.py): a replica killed, ~6 min
    python bench/run.py --merge --skip-overhead --only a-uniform-poisson \
        --systems "envoy + lorapool picker,gie epp (lora-affinity),gie epp (default)"   # issue 47's peer rows
    python bench/run.py --peer-overhead                # our picker's and the GIE EPP's added latency, ~6 min
    python bench/run.py --merge --skip-overhead --only h-a-zipf-gamma,h-rate-limit-c1,h-rate-limit-c100
        # regime (h), issue 43: x1, x3 and x3 shared per door, and the pool rate limit behind an L4 front
    python bench/run.py --merge --skip-overhead --only h-e-zipf-shift \
        --systems "lorapool affinity,lorapool affinity x3,lorapool affinity x3 shared"   # regime (e)'s cell
    python bench/run.py --merge --skip-overhead --only h-f-flood   # regime (f)'s flood cell, 1 and 3 fair routers
    python bench/run.py --shared-overhead              # shared books' added latency beside the router's, ~4 min
    python bench/run.py --loadgen inference-perf --only a-uniform-poisson \
        --systems "envoy + lorapool picker,gie epp (lora-affinity)"   # the same cells driven by inference-perf

Every run starts fresh simulator replicas (cold caches, same seed), then one system in front
of them, then replays the same seeded open-loop schedule. See RESULTS.md for the method.
Regime (h)'s cells (``h-...``, issue 43) run only when --only names them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/run.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results
from bench.chat import arrivals
from bench.loadgen import RunResult, adapter_name, per_adapter, run_open_loop, summarize
from bench.overhead import run_overhead
from bench.report import write_report
from bench.scenarios import EXTRA_SYSTEMS, H_ONLY, H_SCENARIOS, H_SYSTEMS, OUR_PICKER, SCENARIOS, SYSTEMS, Scenario
from bench.systems import System, books_key, oracle_fleet, sim_fleet
from lorapool.api.traffic import AdapterTraffic, Priority, RateLimits, TrafficPolicy

ADAPTERS = "/tmp/lorapool-bench-adapters"  # PEFT dirs, written once and reused (BENCH_ADAPTERS)


def scrape_sims(urls: list[str]) -> dict[str, float]:
    """Sum the simulators' LoRA load counters (by source), stall seconds and prefix-cache tokens."""
    from lorapool_dev.testing.scrape import metric_value, samples, scrape

    totals: dict[str, float] = {"cpu": 0.0, "disk": 0.0, "stall_s": 0.0, "prefix_queries": 0.0, "prefix_hits": 0.0}
    for url in urls:
        page = scrape(url, timeout_s=10)
        for labels, value in samples(page).get("sim:lora_loads_total", []):
            totals[labels.get("from", "")] = totals.get(labels.get("from", ""), 0.0) + value
        totals["stall_s"] += metric_value(page, "sim:lora_load_stall_seconds_total")
        totals["prefix_queries"] += metric_value(page, "vllm:prefix_cache_queries_total")
        totals["prefix_hits"] += metric_value(page, "vllm:prefix_cache_hits_total")
    return totals


async def _measure(
    url: str, sims: list[str], scenario: Scenario
) -> tuple[RunResult, dict[str, float], dict[str, float]]:
    scale = scenario.fleet.time_scale
    plan = [dataclasses.replace(p, at_s=p.at_s * scale) for p in arrivals(scenario.workload)]
    at_warmup: dict[str, float] = {}

    async def snapshot() -> None:
        await asyncio.sleep(scenario.warmup_s * scale)
        at_warmup.update(await asyncio.to_thread(scrape_sims, sims))

    snap = asyncio.create_task(snapshot())
    result = await run_open_loop(url, plan, drain_timeout_s=20.0 * scale, connections=scenario.connections)
    await snap
    at_end = await asyncio.to_thread(scrape_sims, sims)
    return result, at_warmup, at_end


def traffic_policy(scenario: Scenario, routers: int) -> TrafficPolicy | None:
    """The scenario's priorities and pool rate limit as the operator would write them for ``routers``
    router replicas (each enforces 1/routers of a limit); None when it has neither. Pure."""
    if not scenario.priorities and not scenario.rate_limit_rps:
        return None
    limits = RateLimits(requests_per_second=scenario.rate_limit_rps) if scenario.rate_limit_rps else None
    names = [adapter_name(i) for i in range(scenario.workload.adapters)] if limits else []
    priorities = dict(scenario.priorities)
    adapters = {
        model: AdapterTraffic(priority=Priority(priorities.get(model, Priority.STANDARD)), limits=limits)
        for model in dict.fromkeys([*priorities, *names])
    }
    return TrafficPolicy(pool="bench", routers=routers, adapters=adapters)


def with_priorities(system: System, scenario: Scenario, directory: Path) -> System:
    """A lorapool system with the scenario's priorities and rate limit as its --traffic-file (others: unchanged)."""
    policy = traffic_policy(scenario, system.routers)
    if policy is None or system.kind not in ("lorapool", "envoy-picker"):
        return system
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"traffic-{scenario.name}-x{system.routers}.json"
    path.write_text(policy.to_json())
    return dataclasses.replace(system, args=(*system.args, "--traffic-file", str(path)))


def run_one(scenario: Scenario, system: System, adapter_root: Path) -> dict[str, Any]:
    """One system on one scenario, with fresh replicas (and a fresh store, keyed by both, for shared books)."""
    scale = scenario.fleet.time_scale
    started = time.monotonic()
    system = with_priorities(system, scenario, adapter_root)
    if system.shared_books:
        system = dataclasses.replace(system, books_key=books_key(f"bench {scenario.name} {system.name}"))
    fleet = oracle_fleet(scenario.fleet) if system.oracle else scenario.fleet
    with (
        sim_fleet(fleet, adapter_root) as sims,
        system.start(sims, max_cpu_loras=scenario.fleet.max_cpu_loras, time_scale=scale) as url,
    ):
        result, before, after = asyncio.run(_measure(url, sims, scenario))
    # Count only requests sent after the warm-up, in simulated seconds.
    result.outcomes = [o for o in result.outcomes if o.sent_s >= scenario.warmup_s * scale]
    for o in result.outcomes:
        o.sent_s /= scale
        o.ttft_s = o.ttft_s / scale if o.ttft_s is not None else None
        o.done_s = o.done_s / scale if o.done_s is not None else None
    window = scenario.workload.duration_s - scenario.warmup_s
    summary = summarize(result, window_s=window, slo_ttft_s=scenario.slo_ttft_s)
    n = max(1, summary["requests"])
    loads = {
        k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("cpu", "disk", "stall_s", "prefix_queries", "prefix_hits")
    }
    summary.update(
        scenario=scenario.name,
        system=system.name,
        stalls_per_1k=1000.0 * (loads["cpu"] + loads["disk"]) / n,
        disk_loads_per_1k=1000.0 * loads["disk"] / n,
        stall_s_per_1k=1000.0 * loads["stall_s"] / n,
        # the engines' prefix-cache hits over the prompt tokens they looked up (vLLM's counters)
        prefix_hit_rate=loads["prefix_hits"] / loads["prefix_queries"] if loads["prefix_queries"] > 0 else 0.0,
        wall_s=time.monotonic() - started,
        loadavg_1m_end=os.getloadavg()[0],  # the shared machine's load: a busy one stretches every cell
    )
    if scenario.connections:
        summary.update(connections=scenario.connections, connections_opened=result.connections_opened)
    if scenario.rate_limit_rps:  # admitted = answered 200; the rest were refused (429)
        summary.update(pool_limit_rps=scenario.rate_limit_rps, admitted_rps=summary["throughput_rps"])
    if scenario.priorities:  # the noisy neighbour (regime f, and its cell in h) is judged adapter by adapter
        summary["per_adapter"] = per_adapter(result.outcomes, window_s=window, slo_ttft_s=scenario.slo_ttft_s)
    return summary


def run_one_inference_perf(scenario: Scenario, system: System, adapter_root: Path, report_dir: Path) -> dict[str, Any]:
    """One system on one scenario driven by inference-perf, with fresh replicas; summarised as ``run_one``'s
    cells are (adapter loads here count the whole run, warm-up included: its start is inference-perf's)."""
    from bench import inference_perf
    from bench.systems import base_model

    inference_perf.check(scenario.workload)  # before any process starts
    scale = scenario.fleet.time_scale
    started = time.monotonic()
    system = with_priorities(system, scenario, adapter_root)
    with (
        sim_fleet(scenario.fleet, adapter_root) as sims,
        system.start(sims, max_cpu_loras=scenario.fleet.max_cpu_loras, time_scale=scale) as url,
    ):
        before = scrape_sims(sims)
        outs = inference_perf.run_cell(
            scenario.workload, url=url, model=base_model(sims[0]), report_dir=report_dir, time_scale=scale
        )
        after = scrape_sims(sims)
    kept = inference_perf.within(outs, scenario.warmup_s)
    window = scenario.workload.duration_s - scenario.warmup_s
    summary = summarize(RunResult(outcomes=kept), window_s=window, slo_ttft_s=scenario.slo_ttft_s)
    loads = after.get("cpu", 0.0) + after.get("disk", 0.0) - before.get("cpu", 0.0) - before.get("disk", 0.0)
    summary.update(
        scenario=scenario.name,
        system=system.name,
        loadgen=inference_perf.NAME,
        loadgen_version=inference_perf.VERSION,
        stalls_per_1k=1000.0 * loads / max(1, len(outs)),
        disk_loads_per_1k=1000.0 * (after.get("disk", 0.0) - before.get("disk", 0.0)) / max(1, len(outs)),
        report_dir=str(report_dir),
        wall_s=time.monotonic() - started,
    )
    return summary


def describe(s: Scenario) -> dict[str, Any]:
    return {
        "name": s.name,
        "regime": s.regime,
        "about": s.about,
        "slo_ttft_s": s.slo_ttft_s,
        "time_scale": s.fleet.time_scale,
        "warmup_s": s.warmup_s,
        "fleet": dataclasses.asdict(s.fleet),
        "workload": dataclasses.asdict(s.workload),
        **({"priorities": dict(s.priorities)} if s.priorities else {}),
    }


def _stamp(argv: list[str] | None) -> dict[str, str]:
    """When, how and where this run was made (every cell it measures carries its date)."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return {
        "command": " ".join(
            shlex.quote(a) for a in ["python", "bench/run.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" load average {load} at the start",
    }


def main(argv: list[str] | None = None) -> int:
    """The command line: 1. parse the flags, 2. --report-only rewrites RESULTS.md from OUT and stops,
    3. a separate cell's flag (or --overhead-only over an existing results.json) measures that alone,
    4. else the scenario matrix and the overhead; then the report."""
    parser = _parser()
    args = parser.parse_args(argv)
    out: Path = args.out
    report = args.report or out.parent / "RESULTS.md"
    results_path = results.path(out)
    if args.report_only:
        if not results_path.exists():
            parser.error(f"--report-only: {results_path} does not exist; measure into --out {out} first")
        write_report(json.loads(results_path.read_text()), out, report)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    stamp = _stamp(argv)
    adapter_root = Path(os.environ.get("BENCH_ADAPTERS", ADAPTERS))
    data = _measure_separate_cell(args, out, adapter_root, stamp)
    if data is None and args.overhead_only and results_path.exists():
        data = _refresh_overhead(results_path, adapter_root, stamp)
    if data is not None:
        write_report(data, out, report)
        return 0
    data = _measure_matrix(args, out, adapter_root, stamp)
    results.save(out, data)
    write_report(data, out, report)
    print(f"wrote {report} and {out}/")
    return 0


def _parser() -> argparse.ArgumentParser:
    """Every flag of ``bench/run.py`` (the usage is the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--report", type=Path, default=None, help="default: OUT/../RESULTS.md")
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--systems", default="", help="comma-separated system names")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--overhead-only", action="store_true", help="measure the overhead; keep OUT's scenario cells")
    parser.add_argument(
        "--merge", action="store_true", help="keep OUT's results.json and replace only the cells measured now"
    )
    parser.add_argument("--report-only", action="store_true", help="rewrite RESULTS.md from OUT")
    parser.add_argument("--real-engine", action="store_true", help="measure only the vLLM CPU cell (real_engine.json)")
    parser.add_argument(
        "--real-engine-fair",
        action="store_true",
        help="measure only the vLLM CPU fair-dispatch cell (real_engine_fair.json)",
    )
    parser.add_argument(
        "--regime-b-seeds",
        action="store_true",
        help="measure only regime (b) over several seeds, fair vs affinity vs the oracle (bench/seeds.py)",
    )
    parser.add_argument(
        "--large-catalog", action="store_true", help="measure only regime (e), k-of-N placement (into results.json)"
    )
    parser.add_argument("--sizing", action="store_true", help="measure only the max-loras sizing cell (sizing.json)")
    parser.add_argument("--chaos", action="store_true", help="measure only the chaos cell (chaos.json)")
    parser.add_argument(
        "--peer-overhead",
        action="store_true",
        help="measure only our picker's and the GIE EPP's added latency side by side (results.json peer_overhead)",
    )
    parser.add_argument(
        "--shared-overhead",
        action="store_true",
        help="measure only the router's added latency with shared books beside without (results.json shared_overhead)",
    )
    parser.add_argument(
        "--loadgen",
        choices=("ours", "inference-perf"),
        default="ours",
        help="inference-perf: drive the chosen cells with kubernetes-sigs/inference-perf (bench/inference_perf.py),"
        " recorded in results.json under inference_perf",
    )
    return parser


def _measure_separate_cell(
    args: argparse.Namespace, out: Path, adapter_root: Path, stamp: dict[str, str]
) -> dict[str, Any] | None:
    """The cell a mode flag names (first of --loadgen inference-perf, --peer-overhead or --shared-overhead,
    --large-catalog, --real-engine, --regime-b-seeds, --real-engine-fair, --chaos, --sizing), measured into OUT
    by its own module; the results to report, or None when no such flag was given."""
    if args.loadgen == "inference-perf":
        return _measure_inference_perf(args, out, adapter_root, stamp)
    if args.peer_overhead or args.shared_overhead:
        from bench.overhead import run_peer_overhead, run_shared_overhead

        key, measure = (
            ("peer_overhead", run_peer_overhead) if args.peer_overhead else ("shared_overhead", run_shared_overhead)
        )
        data = results.load(out, stamp)
        data[key] = {**measure(adapter_root), **stamp}
        results.save(out, data)
        return data
    if args.large_catalog:
        from bench import large_catalog

        return large_catalog.run(out, adapter_root, stamp, [n for n in args.systems.split(",") if n])
    if args.real_engine:
        from bench import real_engine

        real_engine.run(out, adapter_root / "real-engine", stamp)
        return results.load(out, stamp)
    if args.regime_b_seeds:
        from bench import seeds

        return seeds.run(out, adapter_root, stamp, list(SYSTEMS), run_one)
    if args.real_engine_fair:
        from bench import real_engine_fair

        real_engine_fair.run(out, adapter_root / "real-engine", stamp)
        return results.load(out, stamp)
    if args.chaos:
        from bench import chaos

        chaos.run(out, adapter_root, stamp)
        return results.load(out, stamp)
    if args.sizing:
        from bench import sizing

        sizing.run(out, stamp)
        return results.load(out, stamp)
    return None


def _measure_inference_perf(
    args: argparse.Namespace, out: Path, adapter_root: Path, stamp: dict[str, str]
) -> dict[str, Any]:
    """--loadgen inference-perf: the chosen cells driven by inference-perf, folded into OUT's results.json
    under ``inference_perf`` (a cell measured again replaces its old one); its reports in OUT/inference-perf/."""
    scenarios = [s for s in SCENARIOS if not args.only or s.name in args.only.split(",")]
    chosen = args.systems.split(",")
    systems = [s for s in (*SYSTEMS, *EXTRA_SYSTEMS) if s.name in chosen] if args.systems else list(SYSTEMS)
    data = results.load(out, stamp)
    fresh: dict[str, Any] = {**stamp, "scenarios": [describe(s) for s in scenarios], "runs": []}
    for scenario, system in cells(scenarios, systems, systems_chosen=bool(args.systems)):
        report_dir = out / "inference-perf" / scenario.name / system.name.replace(" ", "_").replace("/", "_")
        try:
            summary = run_one_inference_perf(scenario, system, adapter_root, report_dir)
            summary["report_dir"] = str(report_dir.relative_to(out))
        except Exception as exc:
            summary = {"scenario": scenario.name, "system": system.name, "error": repr(exc)[:500]}
        summary.update(date=stamp["date"], command=stamp["command"], loadgen="inference-perf")
        print(json.dumps({k: v for k, v in summary.items() if k != "ttfts"}, default=str), flush=True)
        fresh["runs"].append(summary)
    section = data.setdefault("inference_perf", {"runs": []})
    section["runs"] = results.merge({**stamp, "scenarios": [], "runs": section["runs"]}, fresh, stamp)["runs"]
    known = {s["name"] for s in data["scenarios"]}
    data["scenarios"] += [s for s in fresh["scenarios"] if s["name"] not in known]
    results.save(out, data)
    return data


def _refresh_overhead(results_path: Path, adapter_root: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """--overhead-only over an existing results.json: measure the overhead section again, keep every cell."""
    data = json.loads(results_path.read_text())
    data["overhead"] = {**run_overhead(adapter_root), **stamp}
    results_path.write_text(json.dumps(data, indent=1, default=str))
    return data


def _measure_matrix(args: argparse.Namespace, out: Path, adapter_root: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """The chosen scenarios x systems (unless --overhead-only), then the overhead (unless
    --skip-overhead); with --merge, folded into OUT's results.json. The results to save."""
    results_path = results.path(out)
    named = (*SCENARIOS, *H_SCENARIOS) if args.only else SCENARIOS  # regime (h) runs when --only names it
    scenarios = [s for s in named if not args.only or s.name in args.only.split(",")]
    chosen = args.systems.split(",")
    systems = [s for s in (*SYSTEMS, *EXTRA_SYSTEMS) if s.name in chosen] if args.systems else list(SYSTEMS)
    previous = json.loads(results_path.read_text()) if args.merge and results_path.exists() else None
    data: dict[str, Any] = {
        **stamp,
        "scenarios": [describe(s) for s in scenarios],
        "runs": [],
        "overhead": None,
    }
    partial = out / "results.partial.json" if previous else results_path
    if not args.overhead_only:
        for scenario, system in cells(scenarios, systems, systems_chosen=bool(args.systems)):
            data["runs"].append(_run_cell(scenario, system, adapter_root, stamp))
            partial.write_text(json.dumps(data, indent=1, default=str))
        if H_CATALOG in args.only.split(","):
            _h_catalog_cells(data, systems if args.systems else [], adapter_root, stamp, partial)
    if not args.skip_overhead:
        data["overhead"] = {**run_overhead(adapter_root), **stamp}
        print(json.dumps({k: v for k, v in data["overhead"].items() if k != "cdf"}, default=str))
    if previous is not None:
        overhead = data["overhead"] or previous.get("overhead")
        data = results.merge(previous, data, stamp)
        data["overhead"] = overhead
        partial.unlink(missing_ok=True)
    return data


H_CATALOG = "h-e-zipf-shift"


def _h_catalog_cells(
    data: dict[str, Any], systems: list[System], adapter_root: Path, stamp: dict[str, str], partial: Path
) -> None:
    """Regime (h) on regime (e)'s headline cell: ``large_catalog``'s scenario and cell, renamed, run with
    ``systems`` (default: regime (h)'s), appended to ``data`` (a failed cell is recorded, not fatal)."""
    from bench import large_catalog

    base = large_catalog.catalog_scenario()
    scenario = dataclasses.replace(base, name=H_CATALOG, regime="h", about=f"{base.about}; as {base.name}")
    data["scenarios"].append(large_catalog.scenario_dict(scenario))
    for system in systems or [s for s in SYSTEMS if s.name in H_SYSTEMS]:
        try:
            cell = large_catalog.run_cell(scenario, system, adapter_root)
        except Exception as exc:
            cell = {"scenario": scenario.name, "system": system.name, "error": repr(exc)[:500]}
        cell["date"] = stamp["date"]
        print(json.dumps({k: v for k, v in cell.items() if k != "goodput_timeline"}, default=str), flush=True)
        data["runs"].append(cell)
        partial.write_text(json.dumps(data, indent=1, default=str))


# Our picker in a regime's own best config runs only where that regime names it (its ``systems``).
REGIME_ONLY = frozenset((*OUR_PICKER.values(), *H_ONLY))


def cells(scenarios: list[Scenario], systems: list[System], *, systems_chosen: bool) -> list[tuple[Scenario, System]]:
    """The (scenario, system) pairs to measure, in order: a regime's own comparison set
    (``Scenario.systems``) applies unless --systems chose the systems. Pure."""
    return [
        (scenario, system)
        for scenario in scenarios
        for system in systems
        if systems_chosen or (system.name in scenario.systems if scenario.systems else system.name not in REGIME_ONLY)
    ]


def _run_cell(scenario: Scenario, system: System, adapter_root: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """``run_one`` dated and printed; a baseline that fails to start is reported, not fatal."""
    try:
        summary = run_one(scenario, system, adapter_root)
    except Exception as exc:
        summary = {"scenario": scenario.name, "system": system.name, "error": repr(exc)[:500]}
    summary["date"] = stamp["date"]
    shown = {k: v for k, v in summary.items() if k != "ttfts"}
    print(json.dumps(shown, default=str), flush=True)
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
