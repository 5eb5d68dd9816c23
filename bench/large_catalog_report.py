"""Regime (e)'s results in RESULTS.md: the section (the systems side by side, placement's ratios
against all-replica affinity) and the plot. Pure over a results.json, but for ``plot``'s file.

``bench/large_catalog.py`` measures the runs; ``bench/report.py`` and ``bench/targets.py`` read them
through here. Tested in tests/router/test_bench_large_catalog.py and tests/bench/test_modes.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.formatting import fmt as _f
from bench.scenarios import LORAPOOL_AFFINITY as AFFINITY
from bench.scenarios import LORAPOOL_PLACEMENT as PLACEMENT


def regime_e(data: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """scenario -> system -> run, for the regime (e) scenarios of a results.json (errors left out)."""
    names = {s["name"] for s in data.get("scenarios", []) if s.get("regime") == "e"}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in data.get("runs", []):
        if run.get("scenario") in names and "error" not in run:
            out.setdefault(run["scenario"], {})[run["system"]] = run
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf if a > 0 else math.nan


def versus_affinity(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, float] | None:
    """Placement over all-replica affinity: goodput x, disk loads affinity/placement x, p99 placement/affinity x."""
    p, a = runs.get(PLACEMENT), runs.get(AFFINITY)
    if not p or not a:
        return None
    return {
        "goodput": _ratio(p["goodput_rps"], a["goodput_rps"]),
        "fewer_disk_loads": _ratio(a["disk_loads_per_1k"], p["disk_loads_per_1k"]),
        "p99": _ratio(p["ttft_p99_s"], a["ttft_p99_s"]),
    }


def _hot(run: Mapping[str, Any]) -> str:
    if run["system"] != PLACEMENT:
        return "all replicas"
    reached = run.get("convergence_s")
    when = f"after {_f(reached, 1)} s" if reached is not None else "not reached in the run"
    return f"{run['hot_after']}: k {run.get('hot_after_k')}, {when}"


def section(data: Mapping[str, Any], plots_dir: str = "results") -> list[str]:
    """RESULTS.md's regime (e) section: per scenario the systems side by side, the ratios, the plot."""
    described = {s["name"]: s for s in data.get("scenarios", [])}
    lines: list[str] = []
    for name, runs in regime_e(data).items():
        sc = described[name]
        fleet, rule = sc["fleet"], sc.get("scaling_rule", {})
        ttft_rule = (
            f"when an adapter's TTFT p99 > {_f(rule.get('expand_ttft_p99_s'), 1)} s or waiting per holder >"
            f" {_f(rule.get('expand_waiting'), 1)}, again on each window measured after the last change,"
            " at most doubling"
        )
        if rule.get("pool_replicas"):  # k sized from the router's request counts (issue 11's share rule)
            inputs = "the router's request counts per adapter and the sidecars' observations of the engines"
            how = (
                f"k straight to ceil(rate / ({rule['expand_share']:g} x the pool's rate per replica)),"
                f" given back below {rule['shrink_share']:g} of it; expand too {ttft_rule}"
            )
        else:
            inputs, how = "the sidecars' observations of the engines", f"expand {ttft_rule}"
        lines += [
            f"## Regime (e): a large catalog, k-of-N placement ({name})",
            "",
            f"{sc['about']}. {fleet['replicas']} simulated replicas, --max-loras {fleet['max_loras']},"
            f" --max-cpu-loras {fleet['max_cpu_loras']}, time scale {fleet['time_scale']:g} wall seconds per"
            f" simulated second (the other regimes run at 4: 16 replicas share the 2 cores), TTFT SLO"
            f" {sc['slo_ttft_s']} s, {sc['workload']['duration_s']:g} s of arrivals of which the first"
            f" {sc['warmup_s']:g} s are warm-up; the popularity shifts at {sc['shift_at_s']:g} s. `{PLACEMENT}`"
            f" runs the operator's placement step (`decide_placement`, `next_k`, `place`) every"
            f" {sc['placement_window_s']:g} s on {inputs} ({how}) and moves adapters with the engines' runtime"
            " API; the others route over every adapter on every replica.",
            "",
            "| system | goodput req/s | goodput after the shift | TTFT p50 s | TTFT p99 s | disk loads /1k req"
            " | adapter loads /1k req | new hot adapter on | placement loads / unloads | failed"
            " | load average (1 min) at the end | measured |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for system, r in runs.items():
            moves = f"{r['placement_loads']} / {r['placement_unloads']}" if system == PLACEMENT else "-"
            lines.append(
                f"| {system} | {_f(r['goodput_rps'], 1)} | {_f(r['goodput_after_shift_rps'], 1)}"
                f" | {_f(r['ttft_p50_s'], 3)} | {_f(r['ttft_p99_s'], 3)} | {_f(r['disk_loads_per_1k'], 0)}"
                f" | {_f(r['stalls_per_1k'], 0)} | {_hot(r)} | {moves} | {r['failed']}"
                f" | {_f(r.get('loadavg_1m_end'), 1)} | {r.get('date') or data.get('date')} |"
            )
        ratios = versus_affinity(runs)
        if ratios:
            lines += [
                "",
                f"`{PLACEMENT}` against all-replica `{AFFINITY}`: goodput {_f(ratios['goodput'])}x (target >= 2x),"
                f" disk loads per 1k requests {_f(ratios['fewer_disk_loads'])}x fewer (target >= 2x),"
                f" p99 TTFT {_f(ratios['p99'])}x (target <= 1x).",
            ]
        if sc.get("note"):
            lines += ["", str(sc["note"])]
        lines += ["", f"![{PLOT}]({plots_dir}/{PLOT})", ""]
    return lines


PLOT = "large_catalog.png"


def plot(data: Mapping[str, Any], out: Path) -> None:
    """Goodput per second for each system, and the new hot adapter's holders under placement."""
    by = regime_e(data)
    if not by:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, runs = next(iter(by.items()))
    shift = next(s["shift_at_s"] for s in data["scenarios"] if s["name"] == name)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    for system, r in runs.items():
        ys = r.get("goodput_timeline") or []
        left.plot([i + 0.5 for i in range(len(ys))], ys, label=system, marker="." if system == PLACEMENT else None)
    for ax in (left, right):
        ax.axvline(shift, color="grey", linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
        ax.set_xlabel("simulated seconds (dashed: the popularity shift)")
    left.set_ylabel("goodput, req/s (by second sent)")
    left.legend(fontsize=7)
    placed = runs.get(PLACEMENT)
    if placed:
        start = float(placed.get("hot_after_initial_holders", 1))
        points = [(0.0, start)] + [(float(t), float(c)) for t, c in placed.get("hot_after_holders", [])]
        end = max(len(placed.get("goodput_timeline") or []), int(shift) + 1)
        xs = [t for t, _ in points] + [float(end)]
        ys = [c for _, c in points] + [points[-1][1]]
        right.step(xs, ys, where="post", label="replicas holding it")
        right.axhline(placed.get("hot_after_k") or 0, color="C3", linestyle=":", label="its k at the end")
        right.set_ylabel("replicas")
        right.set_title(f"new hot adapter {placed['hot_after']} ({PLACEMENT})", fontsize=9)
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / PLOT, dpi=110)
    plt.close(fig)
