"""Write RESULTS.md and the plots from a results.json produced by run.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.scenarios import LORAPOOL_AFFINITY as AFFINITY
from bench.scenarios import LORAPOOL_ROUND_ROBIN

ROUND_ROBINS = (LORAPOOL_ROUND_ROBIN, "nginx round-robin", "vllm-router round_robin")


def _f(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def _runs_by_scenario(data: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in data["runs"]:
        out.setdefault(run["scenario"], {})[run["system"]] = run
    return out


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scenario: affinity vs round-robin and vs the best adapter-blind/baseline policy."""
    rows = []
    for name, runs in _runs_by_scenario(data).items():
        aff = runs.get(AFFINITY)
        if not aff or "error" in aff:
            continue
        rr = runs.get(LORAPOOL_ROUND_ROBIN)
        others = {k: v for k, v in runs.items() if k != AFFINITY and "error" not in v}
        best_name = max(others, key=lambda k: others[k]["goodput_rps"], default=None)
        best = others.get(best_name) if best_name else None
        row: dict[str, Any] = {"scenario": name, "best_other": best_name}
        if rr and "error" not in rr:
            row["goodput_vs_rr"] = aff["goodput_rps"] / max(rr["goodput_rps"], 1e-9)
            row["p99_rr_over_aff"] = rr["ttft_p99_s"] / max(aff["ttft_p99_s"], 1e-9)
        if best:
            row["goodput_vs_best_pct"] = 100.0 * (aff["goodput_rps"] / max(best["goodput_rps"], 1e-9) - 1)
            row["p99_vs_best_pct"] = 100.0 * (aff["ttft_p99_s"] / max(best["ttft_p99_s"], 1e-9) - 1)
        rows.append(row)
    return rows


def plot(data: dict[str, Any], out: Path) -> list[str]:
    """Goodput and p99 TTFT per scenario and system; overhead latency CDF. Returns file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = _runs_by_scenario(data)
    scenarios = list(by)
    systems: list[str] = []
    for runs in by.values():
        systems += [s for s in runs if s not in systems]
    files = []
    for key, label, fname, log in (
        ("goodput_rps", "goodput (req/s within the TTFT SLO, simulated time)", "goodput.png", False),
        ("ttft_p99_s", "TTFT p99 (simulated seconds, log scale)", "ttft_p99.png", True),
    ):
        fig, ax = plt.subplots(figsize=(12, 4.8))
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            values = []
            for sc in scenarios:
                run = by[sc].get(system, {})
                v = run.get(key, math.nan) if "error" not in run else math.nan
                values.append(min(v, 1e3) if isinstance(v, float) else math.nan)
            xs = [j + (i - len(systems) / 2 + 0.5) * width for j in range(len(scenarios))]
            ax.bar(xs, values, width, label=system)
        ax.set_xticks(range(len(scenarios)), scenarios, rotation=15)
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=7, ncol=4)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        files.append(fname)
    overhead = data.get("overhead")
    if overhead and overhead.get("rates"):
        fig, axes = plt.subplots(1, len(overhead["rates"]), figsize=(12, 4.2))
        for ax, (rate, systems_stats) in zip(axes, overhead["rates"].items(), strict=False):
            for name, stats in systems_stats.items():
                if stats["cdf_ms"]:
                    ax.plot(stats["cdf_ms"], range(1, 100), label=name)
            ax.set_xscale("log")
            ax.set_xlabel("request latency, ms (log)")
            ax.set_ylabel("percentile")
            ax.set_title(f"{rate} req/s, --time-scale 0 backend")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "overhead.png", dpi=110)
        plt.close(fig)
        files.append("overhead.png")
    return files


def write_report(data: dict[str, Any], out: Path, report: Path) -> None:
    """RESULTS.md: method, headline ratios, a table per scenario, overhead, plots."""
    files = plot(data, out)
    rel = out.relative_to(report.parent) if out.is_relative_to(report.parent) else out
    lines = [
        "# Routing benchmark results",
        "",
        f"- Command: `{data['command']}`",
        f"- Date: {data['date']}",
        f"- Machine: {data['machine']} (shared with other engineers' processes while it ran)",
        "",
        "## Headline (lorapool affinity vs the others, same run)",
        "",
        "| scenario | goodput vs lorapool round-robin | p99 TTFT: round-robin / affinity"
        " | best other system | goodput vs best other | p99 TTFT vs best other |",
        "|---|---|---|---|---|---|",
    ]
    for row in headline(data):
        lines.append(
            f"| {row['scenario']} | {_f(row.get('goodput_vs_rr'))}x | {_f(row.get('p99_rr_over_aff'))}x"
            f" | {row.get('best_other') or '-'} | {_f(row.get('goodput_vs_best_pct'), 1)} %"
            f" | {_f(row.get('p99_vs_best_pct'), 1)} % |"
        )
    lines += ["", "## Per scenario", ""]
    scenarios = {s["name"]: s for s in data["scenarios"]}
    for name, runs in _runs_by_scenario(data).items():
        sc = scenarios.get(name, {})
        fleet = sc.get("fleet", {})
        lines += [
            f"### {name}: {sc.get('about', '')}",
            "",
            f"{fleet.get('replicas')} replicas, --max-loras {fleet.get('max_loras')}, "
            f"--max-cpu-loras {fleet.get('max_cpu_loras')}, TTFT SLO {sc.get('slo_ttft_s')} s, "
            f"{sc.get('workload', {}).get('duration_s')} s of arrivals of which the first "
            f"{sc.get('warmup_s')} s are warm-up (not counted).",
            "",
            "| system | throughput req/s | goodput req/s | TTFT p50 s | TTFT p99 s"
            " | adapter loads /1k req | disk loads /1k req | load stall s /1k req | failed |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for system, r in runs.items():
            if "error" in r:
                lines.append(f"| {system} | error: {r['error'][:80]} | | | | | | | |")
                continue
            lines.append(
                f"| {system} | {_f(r['throughput_rps'], 1)} | {_f(r['goodput_rps'], 1)}"
                f" | {_f(r['ttft_p50_s'], 3)} | {_f(r['ttft_p99_s'], 3)} | {_f(r['stalls_per_1k'], 0)}"
                f" | {_f(r['disk_loads_per_1k'], 0)} | {_f(r['stall_s_per_1k'], 2)} | {r['failed']} |"
            )
        lines.append("")
    overhead = data.get("overhead")
    if overhead:
        lines += [
            "## Router overhead",
            "",
            f"One replica with `--time-scale 0`, non-streamed 1-token requests, open loop, "
            f"{overhead['duration_s']} s per run, {overhead['repeats']} interleaved repeats "
            "(medians; the per-run values show the noise of the shared machine).",
            "",
            "| rate | system | latency p50 ms | p99 ms | added p50 ms | added p99 ms | p99 per run |",
            "|---|---|---|---|---|---|---|",
        ]
        for rate, systems in overhead["rates"].items():
            for name, s in systems.items():
                runs99 = ", ".join(_f(v, 1) for v in s["p99_ms_runs"])
                lines.append(
                    f"| {rate} req/s | {name} | {_f(s['p50_ms'])} | {_f(s['p99_ms'])}"
                    f" | {_f(s['added_p50_ms'])} | {_f(s['added_p99_ms'])} | {runs99} |"
                )
        relay = overhead["relay"]
        lines += [
            "",
            "First streamed chunk (TTFT) on a real-time replica, 20 req/s, direct vs through"
            f" lorapool: p50 {_f(relay['direct']['p50_ms'], 1)} vs"
            f" {_f(relay[AFFINITY]['p50_ms'], 1)} ms (+{_f(relay['added_p50_ms'], 1)}),"
            f" p99 {_f(relay['direct']['p99_ms'], 1)} vs {_f(relay[AFFINITY]['p99_ms'], 1)} ms"
            f" (+{_f(relay['added_p99_ms'], 1)}).",
            "",
        ]
    lines += ["## Plots", ""] + [f"![{f}]({rel}/{f})" for f in files] + [""]
    notes = Path(__file__).with_name("NOTES.md")
    if notes.exists():
        lines += [notes.read_text()]
    report.write_text("\n".join(lines))
