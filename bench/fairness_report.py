"""Regime (f), the noisy neighbour: the targets' cells, read from results.json. Pure.

The cells compare each adapter with itself: its p99 TTFT in f-flood over its p99 in f-quiet (the
same arrivals but the flood's, ``loadgen.flood_schedule``), the flood's throughput over its
max-min fair share of what the pool served, the critical adapter's share within its SLO, and
fair dispatch's goodput beside affinity's (work conservation), in f and in regime (b).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from bench import seeds
from bench.scenarios import F_CRITICAL, F_FLOOD, LORAPOOL_AFFINITY, LORAPOOL_FAIR, ORACLE

QUIET, FLOOD = "f-quiet", "f-flood"


def max_min_share(demands: Mapping[str, float], capacity: float, key: str) -> float:
    """``key``'s max-min fair share of ``capacity`` given every key's demand (water-filling)."""
    left, keys = capacity, sorted(demands, key=lambda k: demands[k])
    for i, k in enumerate(keys):
        level = left / (len(keys) - i)
        if demands[k] >= level:
            return level if k == key else min(demands[key], level)
        if k == key:
            return demands[k]
        left -= demands[k]
    return 0.0


def _runs(data: dict[str, Any], scenario: str) -> dict[str, dict[str, Any]]:
    return {r["system"]: r for r in data.get("runs", []) if r["scenario"] == scenario and "per_adapter" in r}


def _label(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "" if a.get("date") == b.get("date") else f" [runs of {a.get('date')} and {b.get('date')}]"


def worst_p99_ratio(quiet: dict[str, Any], flood: dict[str, Any], flooder: str = F_FLOOD) -> tuple[float, str]:
    """The largest p99 TTFT ratio (flood over quiet) among the well-behaved adapters, and whose."""
    worst, who = math.nan, ""
    for model, q in quiet["per_adapter"].items():
        f = flood["per_adapter"].get(model)
        if model == flooder or f is None or not q["ttft_p99_s"] > 0:
            continue
        ratio = f["ttft_p99_s"] / q["ttft_p99_s"]
        if not ratio <= worst:  # NaN start, and an infinite p99 (a failure) counts as worst
            worst, who = ratio, model
    return worst, who


def p99_cells(system: str) -> Callable[[dict[str, Any]], list[tuple[str, float]]]:
    def cells(data: dict[str, Any]) -> list[tuple[str, float]]:
        quiet, flood = _runs(data, QUIET).get(system), _runs(data, FLOOD).get(system)
        if quiet is None or flood is None:
            return []
        worst, who = worst_p99_ratio(quiet, flood)
        return [(f"{system}, worst: {who}{_label(quiet, flood)}", worst)]

    return cells


def flood_share(data: dict[str, Any]) -> list[tuple[str, float]]:
    """Fair dispatch's flood throughput over its max-min share of the pool's throughput in f-flood."""
    run = _runs(data, FLOOD).get(LORAPOOL_FAIR)
    if run is None:
        return []
    adapters = run["per_adapter"]
    # each adapter's offered rate, in the per-second units of its throughput
    demands = {m: a["requests"] / _window_s(run) for m, a in adapters.items()}
    share = max_min_share(demands, run["throughput_rps"], F_FLOOD)
    served = adapters.get(F_FLOOD, {}).get("throughput_rps", 0.0)
    return [(f"{served:.1f} of a {share:.1f} req/s share", served / share if share > 0 else math.nan)]


def _window_s(run: dict[str, Any]) -> float:
    """The counted window, from the run's own numbers (completed requests over throughput)."""
    return run["completed"] / run["throughput_rps"] if run["throughput_rps"] > 0 else math.nan


def critical_within_slo(data: dict[str, Any]) -> list[tuple[str, float]]:
    run = _runs(data, FLOOD).get(LORAPOOL_FAIR)
    if run is None or F_CRITICAL not in run["per_adapter"]:
        return []
    a = run["per_adapter"][F_CRITICAL]
    return [(f"{F_CRITICAL}, {a['requests']} requests", a["within_slo"])]


def goodput_vs_affinity(data: dict[str, Any]) -> list[tuple[str, float]]:
    runs = _runs(data, FLOOD)
    fair, aff = runs.get(LORAPOOL_FAIR), runs.get(LORAPOOL_AFFINITY)
    if fair is None or aff is None:
        return []
    value = fair["goodput_rps"] / aff["goodput_rps"] if aff["goodput_rps"] > 0 else math.inf
    return [(FLOOD + _label(fair, aff), value)]


def _gap(fair: dict[str, Any], aff: dict[str, Any], oracle: dict[str, Any]) -> tuple[float, float] | None:
    """Fair's and affinity's goodput as fractions of the oracle's, when all three served."""
    if not (oracle["goodput_rps"] > 0 and aff["goodput_rps"] > 0):
        return None
    return fair["goodput_rps"] / oracle["goodput_rps"], aff["goodput_rps"] / oracle["goodput_rps"]


def _seeded_gap(data: dict[str, Any], name: str) -> tuple[str, float] | None:
    """The median over the ``seeds`` cell's seeds of fair's fraction over affinity's, each seed's three
    systems run back to back; None unless two or more seeds have all three."""
    per = []
    for seed, by in sorted(seeds.per_seed(data, name).items()):
        three = all(s in by for s in (LORAPOOL_FAIR, LORAPOOL_AFFINITY, ORACLE))
        if three and (gap := _gap(by[LORAPOOL_FAIR], by[LORAPOOL_AFFINITY], by[ORACLE])) is not None:
            per.append((seed, *gap))
    if len(per) < 2:
        return None
    shown = ", ".join(f"seed {seed} {f:.2f} vs {a:.2f}" for seed, f, a in per)
    when = (data.get("seeds") or {}).get("date")
    return f"{name}, median of {len(per)} seeds ({shown}) [{when}]", statistics.median(f / a for _, f, a in per)


def oracle_gap(data: dict[str, Any]) -> list[tuple[str, float]]:
    """Regime (b): fair dispatch's goodput fraction of the oracle over affinity's (the same as the goodputs'
    ratio when both ran beside one oracle run); the median over seeds where the ``seeds`` cell has them,
    as one run moves by more than the difference asked about (bench/seeds.py)."""
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    out = []
    for name in sorted(n for n, r in regimes.items() if r == "b"):
        if (median := _seeded_gap(data, name)) is not None:
            out.append(median)
            continue
        runs = {r["system"]: r for r in data.get("runs", []) if r["scenario"] == name and "error" not in r}
        fair, aff, oracle = runs.get(LORAPOOL_FAIR), runs.get(LORAPOOL_AFFINITY), runs.get(ORACLE)
        if fair is None or aff is None or oracle is None or (gap := _gap(fair, aff, oracle)) is None:
            continue
        f, a = gap
        out.append((f"{name}: {f:.2f} vs {a:.2f}{_label(fair, aff)}", f / a))
    return out


def why_p99(data: dict[str, Any]) -> str:
    """The same ratio for the other systems of the regime, measured in the same runs."""
    quiet, flood = _runs(data, QUIET), _runs(data, FLOOD)
    parts = []
    for system in flood:
        if system in quiet and system != LORAPOOL_FAIR:
            worst, who = worst_p99_ratio(quiet[system], flood[system])
            parts.append(f"{system} {worst:.2f}x ({who})")
    return ("the same ratio without fair dispatch: " + ", ".join(parts)) if parts else ""
