"""Write RESULTS.md and the plots from a results.json produced by run.py.

Every line of RESULTS.md comes from here: the numbers and verdicts from results.json, the
method from METHOD.md (text about how the benchmark works, no measured number in it). So
``python bench/run.py --report-only`` rebuilds the whole file, and a re-run cannot leave
stale prose beside new numbers. ``render`` is pure (a test rebuilds the committed file from
the committed results.json byte for byte); ``write_report`` adds the plots and writes.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

from bench import chaos, large_catalog_report, peer_report, real_engine, real_engine_fair
from bench import sizing as sizing_cell
from bench.formatting import fmt as _f
from bench.h_report import h_pairs
from bench.results import across, runs_by_scenario
from bench.scenarios import H_RATE_SYSTEMS, LORAPOOL_ROUND_ROBIN, NOT_BASELINES, ORACLE, several, shared
from bench.scenarios import LORAPOOL_AFFINITY as AFFINITY
from bench.targets import CAPACITY_ADDED_P99_MS, TARGETS, capacity

METHOD = Path(__file__).with_name("METHOD.md")
PLOTS = ("goodput.png", "ttft_p99.png", "overhead.png")


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _session(run: dict[str, Any], data: dict[str, Any]) -> str:
    """When a cell was measured: its own date, else the date of the run that wrote results.json."""
    return str(run.get("date") or data["date"])


def sessions(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every benchmark run whose cells this results.json holds, oldest first."""
    found = {s["date"]: s for s in data.get("sessions", [])}
    found.setdefault(data["date"], {"date": data["date"], "command": data["command"], "machine": data["machine"]})
    return sorted(found.values(), key=lambda s: s["date"])


def headline(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scenario: affinity vs round-robin, vs the best baseline and vs the oracle."""
    rows = []
    regimes = {s["name"]: s.get("regime") for s in data.get("scenarios", [])}
    for name, runs in runs_by_scenario(data).items():
        aff = runs.get(AFFINITY)
        if not aff or regimes.get(name) == "h":  # regime (h) compares routers with routers: its own section
            continue
        rr, oracle = runs.get(LORAPOOL_ROUND_ROBIN), runs.get(ORACLE)
        others = {k: v for k, v in runs.items() if k not in NOT_BASELINES}
        best_name = max(others, key=lambda k: others[k]["goodput_rps"], default=None)
        best_label = best_name and best_name + across(aff, others[best_name])
        row: dict[str, Any] = {"scenario": name, "best_other": best_label}
        if rr:
            row["goodput_vs_rr"] = _ratio(aff["goodput_rps"], rr["goodput_rps"])
            row["p99_rr_over_aff"] = _ratio(rr["ttft_p99_s"], aff["ttft_p99_s"])
            row["loads"] = f"{_f(aff['stalls_per_1k'], 0)} vs {_f(rr['stalls_per_1k'], 0)}"
        if best_name:
            best = others[best_name]
            row["goodput_vs_best_pct"] = 100.0 * (_ratio(aff["goodput_rps"], best["goodput_rps"]) - 1)
            row["p99_vs_best_pct"] = 100.0 * (_ratio(aff["ttft_p99_s"], best["ttft_p99_s"]) - 1)
        if oracle:
            row["goodput_of_oracle"] = _ratio(aff["goodput_rps"], oracle["goodput_rps"])
            row["oracle_p99_over_aff"] = _ratio(oracle["ttft_p99_s"], aff["ttft_p99_s"])
        rows.append(row)
    return rows


def _targets(data: dict[str, Any]) -> list[str]:
    lines = [
        "## Targets",
        "",
        "Each target is a record in `bench/targets.py` (issue, bound); its verdict is computed from"
        " results.json: met when every cell is within the bound.",
        "",
        "| issue | target | bound | measured | verdict |",
        "|---|---|---|---|---|",
    ]
    causes: list[str] = []
    for t in TARGETS:
        cells, verdict = t.verdict(data)
        shown = []
        for c in cells:
            mark = "" if t.passes(c) else " (out)"
            limit = f", bound {_f(c.limit)}{t.unit}" if c.limit is not None and c.limit != t.limit else ""
            digits = 0 if t.unit in (" req/s", " requests") else 2
            shown.append(f"{_f(c.value, digits)}{t.unit} {c.label}{limit}{mark}")
        lines.append(f"| {t.issue} | {t.what} | {t.bound} | {'; '.join(shown) or '-'} | {verdict} |")
        if verdict == "missed" and t.why is not None and (cause := t.why(data)):
            causes.append(f"- **{t.what}** (issue {t.issue}): {cause}.")
    if causes:
        lines += ["", "Why the misses, from the same results:", "", *causes]
    return [*lines, ""]


def _headline(data: dict[str, Any]) -> list[str]:
    lines = [
        "## Headline (lorapool affinity vs the others, same run)",
        "",
        "Oracle columns: affinity's goodput as a fraction of the oracle's, and the oracle's p99 TTFT"
        " as a fraction of affinity's (1.00 = as good as the bound).",
        "",
        "| scenario | goodput vs lorapool round-robin | p99 TTFT: round-robin / affinity"
        " | adapter loads /1k: affinity vs round-robin | best other system | goodput vs best other"
        " | p99 TTFT vs best other | goodput / oracle's | oracle's p99 TTFT / affinity's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in headline(data):
        lines.append(
            f"| {row['scenario']} | {_f(row.get('goodput_vs_rr'))}x | {_f(row.get('p99_rr_over_aff'))}x"
            f" | {row.get('loads', '-')} | {row.get('best_other') or '-'}"
            f" | {_f(row.get('goodput_vs_best_pct'), 1)} % | {_f(row.get('p99_vs_best_pct'), 1)} %"
            f" | {_f(row.get('goodput_of_oracle'))} | {_f(row.get('oracle_p99_over_aff'))} |"
        )
    return [*lines, ""]


# Regime (h)'s rows per cell and door: routers, and whether they share their books (x1: the door itself).
H_ROWS = ((1, False), (2, False), (3, False), (2, True), (3, True))


def _h_system(door: str, routers: int, books: bool) -> str:
    if routers == 1:
        return door
    return shared(several(door, routers)) if books else several(door, routers)


def _regime_h(data: dict[str, Any]) -> list[str]:
    """RESULTS.md's regime (h) section: per cell and door, 1-3 routers side by side, with their own books
    and shared; then the rate limit."""
    many = [partial(_h_system, routers=n, books=books) for n, books in H_ROWS[1:]]
    pairs = list(dict.fromkeys((name, door) for m in many for name, door, _, _ in h_pairs(data, m)))
    rates = [(name, runs) for name, runs in runs_by_scenario(data).items() if any(s in runs for s in H_RATE_SYSTEMS)]
    if not pairs and not rates:
        return []
    lines = [
        "## Regime (h): several routers, with their own books and shared (issue 43)",
        "",
        "N `lorapool router` processes with the same flags over the same replicas, behind nginx round robin"
        " per request; N pickers as the endpoints of Envoy's ext_proc cluster (round robin per gRPC stream,"
        " one per request). Each router keeps its own books (the before), or, shared, all N keep one set in a"
        " Redis on 127.0.0.1 (`--shared-state`, one store per run). x1 is the ordinary system.",
        "",
        "| cell | door | routers | goodput req/s | TTFT p50 s | TTFT p99 s | adapter loads /1k | failed"
        " | load average at the end | measured |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = runs_by_scenario(data)
    for name, door in sorted(pairs, key=lambda p: p[0]):  # doors in h_pairs' order within a cell
        for n, books in H_ROWS:
            if (r := by[name].get(_h_system(door, n, books))) is not None:
                lines.append(
                    f"| {name} | {door} | {n}{' shared' if books else ''} | {_f(r['goodput_rps'], 1)}"
                    f" | {_f(r['ttft_p50_s'], 3)} | {_f(r['ttft_p99_s'], 3)} | {_f(r['stalls_per_1k'], 0)} | {r['failed']}"
                    f" | {_f(r.get('loadavg_1m_end', math.nan), 1)} | {_session(r, data)} |"
                )
    if rates:
        lines += [
            "",
            "The rate-limit cell: nginx `stream {}` (TCP round robin per connection, as a Kubernetes Service pins"
            " a connection to one pod) over 1 or 3 routers, the load generator holding exactly C keep-alive"
            " connections, one adapter offered 3x its pool limit (each router with its own books enforces"
            " 1/routers of it; sharing routers split it by their share of the demand).",
            "",
            "| cell | system | connections (opened) | pool limit req/s | admitted req/s | admitted / limit"
            " | refused (429) | measured |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, runs in rates:
            for system in H_RATE_SYSTEMS:
                if (r := runs.get(system)) is not None:
                    lines.append(
                        f"| {name} | {system} | {r['connections']} ({r['connections_opened']})"
                        f" | {_f(r['pool_limit_rps'], 1)} | {_f(r['admitted_rps'], 2)}"
                        f" | {_f(_ratio(r['admitted_rps'], r['pool_limit_rps']))} | {r['codes'].get('429', 0)}"
                        f" | {_session(r, data)} |"
                    )
    return [*lines, ""]


def _scenarios(data: dict[str, Any]) -> list[str]:
    lines = ["## Per scenario", ""]
    described = {s["name"]: s for s in data["scenarios"]}
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for run in data["runs"]:
        by.setdefault(run["scenario"], {})[run["system"]] = run
    for name, runs in by.items():
        sc = described.get(name, {})
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
            " | adapter loads /1k req | disk loads /1k req | load stall s /1k req | failed | measured |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for system, r in runs.items():
            when = _session(r, data)
            if "error" in r:
                lines.append(f"| {system} | error: {r['error'][:80]} | | | | | | | | {when} |")
                continue
            lines.append(
                f"| {system} | {_f(r['throughput_rps'], 1)} | {_f(r['goodput_rps'], 1)}"
                f" | {_f(r['ttft_p50_s'], 3)} | {_f(r['ttft_p99_s'], 3)} | {_f(r['stalls_per_1k'], 0)}"
                f" | {_f(r['disk_loads_per_1k'], 0)} | {_f(r['stall_s_per_1k'], 2)} | {r['failed']} | {when} |"
            )
        lines.append("")
    return lines


def _spread(values: list[float]) -> str:
    return f"{_f(min(values), 1)}-{_f(max(values), 1)}" if values else "-"


def _overhead(data: dict[str, Any]) -> list[str]:
    """RESULTS.md's router overhead section: 1. the table per rate and system, 2. the capacity
    per system (with three rates or more), 3. the streamed first chunk through the relay."""
    overhead = data.get("overhead")
    if not overhead:
        return []
    rates = overhead["rates"]
    lines = _overhead_table(overhead, overhead.get("date") or data["date"])
    if len(rates) >= 3:
        lines += _overhead_capacity(overhead)
    relay = overhead.get("relay")
    if relay:
        lines += _overhead_relay(relay)
    return lines


def _overhead_table(overhead: dict[str, Any], when: str) -> list[str]:
    """The method paragraph and one row per rate and system: latency, added latency, late sends."""
    lines = [
        "## Router overhead",
        "",
        f"Measured {when}. One replica with `--time-scale 0`, non-streamed 1-token requests, open loop,"
        f" {overhead['duration_s']} s per rate, {overhead['repeats']} repeats interleaved across systems"
        " (medians; the range shows the noise of the shared machine). Added = the system's percentile"
        " minus direct's in the same repeat, then the median over repeats when the runs hold it"
        f" (else the difference of the medians). Load average (1 min) at the end: {_f(overhead.get('loadavg_1m'))}.",
        "",
        "| rate | system | latency p50 ms | p99 ms | added p50 ms | added p99 ms | p99 per run ms"
        " | added p99 range ms | late sends % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rate, systems in overhead["rates"].items():
        for name, s in systems.items():
            runs99 = ", ".join(_f(v, 1) for v in s["p99_ms_runs"])
            late = _f(s["late_pct"], 1) if "late_pct" in s else "-"
            lines.append(
                f"| {rate} req/s | {name} | {_f(s['p50_ms'])} | {_f(s['p99_ms'])}"
                f" | {_f(s['added_p50_ms'])} | {_f(s['added_p99_ms'])} | {runs99}"
                f" | {_spread(s.get('added_p99_ms_runs', []))} | {late} |"
            )
    lines.append("")
    return lines


def _overhead_capacity(overhead: dict[str, Any]) -> list[str]:
    """Each router's capacity under the added-p99 bound, and where the load generator fell behind."""
    rates = overhead["rates"]
    names = [n for n in next(iter(rates.values()), {}) if n != "direct"]
    limit = overhead.get("loadgen_limit_rps")
    return [
        f"Capacity (highest rate with a median added p99 <= {CAPACITY_ADDED_P99_MS:g} ms, every lower"
        " rate too): " + ", ".join(f"{n} {_f(capacity(rates, n), 0)} req/s" for n in names) + ".",
        "The load generator (one Python process) falls behind its schedule (> 1 % of requests sent"
        f" > 5 ms late, direct) at {_f(limit, 0)} req/s: rates from there on measure it, not the routers."
        if limit
        else "The load generator kept its schedule (<= 1 % late sends, direct) at every rate measured.",
        "",
    ]


def _overhead_relay(relay: dict[str, Any]) -> list[str]:
    """The first streamed chunk on a real-time replica, direct vs through lorapool (and the others)."""
    runs = relay.get("added_p99_ms_runs")
    spread = f"; added p99 per repeat {', '.join(_f(v, 1) for v in runs)} ms" if runs else ""
    others = [
        f"{name} +{_f(s['added_p50_ms'], 1)} / +{_f(s['added_p99_ms'], 1)} ms"
        for name, s in relay.items()
        if isinstance(s, dict) and name not in ("direct", AFFINITY) and "added_p99_ms" in s
    ]
    return [
        f"First streamed chunk (TTFT) on a real-time replica, {_f(relay.get('rate_rps', 20.0), 0)} req/s, direct"
        f" vs through lorapool: p50 {_f(relay['direct']['p50_ms'], 1)} vs"
        f" {_f(relay[AFFINITY]['p50_ms'], 1)} ms (+{_f(relay['added_p50_ms'], 1)}),"
        f" p99 {_f(relay['direct']['p99_ms'], 1)} vs {_f(relay[AFFINITY]['p99_ms'], 1)} ms"
        f" (+{_f(relay['added_p99_ms'], 1)}){spread}."
        + (f" Same run, added p50 / p99: {'; '.join(others)}." if others else ""),
        "",
    ]


def real_engine_cells(results_dir: Path) -> list[str]:
    """The sections of the cells measured on real vLLM: affinity vs round-robin, fair dispatch."""
    return real_engine.section(results_dir) + real_engine_fair.section(results_dir)


def render(
    data: dict[str, Any],
    plots_dir: str = "results",
    real_engine_section: list[str] | None = None,
    chaos_data: dict[str, Any] | None = None,
    sizing_data: dict[str, Any] | None = None,
    results_dir: Path | None = None,
) -> str:
    """The whole of RESULTS.md for ``data``; ``plots_dir`` is the plots' path relative to it.

    The separate cells (real engine, chaos, sizing) default to the committed ones beside the
    committed results; ``write_report`` passes those of the directory it reports on."""
    committed = Path(__file__).resolve().parent / "results"
    if chaos_data is None:
        chaos_data = chaos.load(committed) or {}
    if sizing_data is None:
        sizing_data = sizing_cell.load(committed) or {}
    data = {**data, "chaos": chaos_data, "sizing": sizing_data}  # their targets read them
    lines = ["# Routing benchmark results", "", "Written by `bench/report.py` from `bench/results/results.json`:"]
    lines += ["do not edit by hand (`python bench/run.py --report-only` rewrites it).", ""]
    lines += ["| measured | command | machine |", "|---|---|---|"]
    for s in sessions(data):
        lines.append(f"| {s['date']} | `{s['command']}` | {s['machine']} |")
    over = data.get("overhead") or {}
    if over.get("date") and over.get("command"):
        lines.append(f"| {over['date']} | `{over['command']}` (overhead) | {over.get('machine', data['machine'])} |")
    notes = [f"- {s['date']}: {s['note']}" for s in sessions(data) if s.get("note")]
    lines += ["", *notes] if notes else []
    lines += [
        "",
        "Every run shared its 2 cores with other engineers' processes (builds, tests), so cells are"
        " noisy: compare systems within one run, and read ratios rather than absolute values.",
        "",
    ]
    lines += _targets(data) + _headline(data) + _regime_h(data) + _scenarios(data) + _overhead(data)
    if real_engine_section is None:  # the committed cell beside the committed results
        real_engine_section = real_engine_cells(committed)
    lines += real_engine_section
    lines += sizing_cell.section(data["sizing"])
    lines += chaos.section(chaos_data, plots_dir)
    lines += large_catalog_report.section(data, plots_dir)
    lines += peer_report.section(data)
    lines += scale_section(results_dir or committed)
    lines += ["## Plots", ""] + [f"![{f}]({plots_dir}/{f})" for f in PLOTS] + [""]
    lines += [METHOD.read_text().rstrip("\n"), ""]
    return "\n".join(lines)


def scale_section(results_dir: Path) -> list[str]:
    """Issue 44's catalogue-scale section, from its own files (``results_dir/scale-*.json``, written by
    ``bench/scale.py``) through its own renderer, so regenerating RESULTS.md keeps it."""
    import json

    files = sorted(results_dir.glob("scale-*.json"))
    if not files:
        return []
    from bench import scale_report

    body = scale_report.section([json.loads(f.read_text()) for f in files])
    return ["## Catalogue scale (issue 44, `python -m bench.scale`)", "", body.rstrip("\n"), ""]


# The bar charts ``plot`` draws: the run's field, the y-axis label, the file and a log scale.
BARS = (
    ("goodput_rps", "goodput (req/s within the TTFT SLO, simulated time)", "goodput.png", False),
    ("ttft_p99_s", "TTFT p99 (simulated seconds, log scale)", "ttft_p99.png", True),
)


def plot(data: dict[str, Any], out: Path) -> None:
    """Goodput and p99 TTFT per scenario and system; overhead latency CDF (called by ``write_report``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = {s["name"]: s.get("regime") for s in data.get("scenarios", [])}
    # regime (h) compares routers with routers (its own section), not the systems of these bars
    by = {name: runs for name, runs in runs_by_scenario(data).items() if regimes.get(name) != "h"}
    for key, label, fname, log in BARS:
        fig = _bar_chart(plt, by, key, label, log)
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
    overhead = data.get("overhead")
    if overhead and overhead.get("rates"):
        fig = _overhead_chart(plt, overhead["rates"])
        fig.savefig(out / "overhead.png", dpi=110)
        plt.close(fig)


def _bar_chart(plt: Any, by: dict[str, dict[str, dict[str, Any]]], key: str, label: str, log: bool) -> Any:
    """One bar per system in each scenario's group, ``key`` of its run (capped at 1e3); the figure."""
    scenarios = list(by)
    systems: list[str] = []
    for runs in by.values():
        systems += [s for s in runs if s not in systems]
    fig, ax = plt.subplots(figsize=(12, 4.8))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        values = []
        for sc in scenarios:
            v = by[sc].get(system, {}).get(key, math.nan)
            values.append(min(v, 1e3) if isinstance(v, float) else math.nan)
        xs = [j + (i - len(systems) / 2 + 0.5) * width for j in range(len(scenarios))]
        ax.bar(xs, values, width, label=system)
    ax.set_xticks(range(len(scenarios)), scenarios, rotation=15)
    ax.set_ylabel(label)
    if log:
        ax.set_yscale("log")
    if systems:  # a results file with the overhead only has no cells yet
        ax.legend(fontsize=7, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _overhead_chart(plt: Any, rates: dict[str, Any]) -> Any:
    """Two panels: added p99 against the offered rate, and the latency CDF at 500 req/s; the figure."""
    fig, (curve, cdf) = plt.subplots(1, 2, figsize=(12, 4.2))
    _added_p99_curve(curve, rates)
    _latency_cdf(cdf, rates)
    fig.tight_layout()
    return fig


def _added_p99_curve(curve: Any, rates: dict[str, Any]) -> None:
    """Each router's median added p99 per offered rate, with the capacity bound dashed."""
    names = list(next(iter(rates.values())))
    xs = sorted(rates, key=float)
    for name in names:
        if name == "direct":
            continue
        ys = [rates[r].get(name, {}).get("added_p99_ms", math.nan) for r in xs]
        curve.plot([float(x) for x in xs], ys, marker="o", label=name)
    curve.axhline(CAPACITY_ADDED_P99_MS, color="grey", linestyle="--", linewidth=1)
    curve.set_xlabel("offered rate, req/s")
    curve.set_ylabel("added p99 latency, ms (median of repeats)")
    curve.set_yscale("symlog", linthresh=1.0)
    curve.grid(alpha=0.3)
    curve.legend(fontsize=7)


def _latency_cdf(cdf: Any, rates: dict[str, Any]) -> None:
    """Every system's latency percentiles at 500 req/s (else the highest rate measured)."""
    rate = "500" if "500" in rates else sorted(rates, key=float)[-1]
    for name, stats in rates[rate].items():
        if stats["cdf_ms"]:
            cdf.plot(stats["cdf_ms"], range(1, 100), label=name)
    cdf.set_xscale("log")
    cdf.set_xlabel("request latency, ms (log)")
    cdf.set_ylabel("percentile")
    cdf.set_title(f"{rate} req/s, --time-scale 0 backend")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize=7)


def write_report(data: dict[str, Any], out: Path, report: Path) -> None:
    """Plots into ``out``, RESULTS.md at ``report``."""
    plot(data, out)
    chaos.plot(out)
    large_catalog_report.plot(data, out)
    rel = out.relative_to(report.parent) if out.is_relative_to(report.parent) else out
    cells = real_engine_cells(out), chaos.load(out) or {}, sizing_cell.load(out) or {}
    report.write_text(render(data, rel.as_posix(), *cells, results_dir=out))
