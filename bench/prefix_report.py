"""Regime (g), chat: the targets' cells, read from results.json. Pure.

``lorapool affinity + prefix`` against ``lorapool affinity`` in the same scenario: the p50 TTFT
ratio (what prefix locality buys a conversation), goodput (it must not cost throughput within the
SLO) and adapter loads per 1,000 requests (it must not undo adapter grouping).
"""

from __future__ import annotations

import math
from typing import Any

from bench.chat import cacheable_fraction, chat_schedule
from bench.results import across, runs_by_scenario
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_PREFIX, SCENARIOS
from lorapool.sim.engine import EngineConfig

SIM_BLOCK_SIZE = EngineConfig.block_size  # the bench's replicas run the simulator's default


def _pairs(data: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(scenario, prefix run, affinity run) for every regime (g) scenario measured with both."""
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    return [
        (name, by[LORAPOOL_PREFIX], by[LORAPOOL_AFFINITY])
        for name, by in sorted(runs_by_scenario(data).items())
        if regimes.get(name) == "g" and LORAPOOL_PREFIX in by and LORAPOOL_AFFINITY in by
    ]


def _label(name: str, a: dict[str, Any], b: dict[str, Any]) -> str:
    return name + across(a, b)


def _ratio(num: float, den: float) -> float:
    """num / den, where 0 / 0 is 1 (both none: no worse) and x / 0 is infinite."""
    if den > 0:
        return num / den
    return 1.0 if num == 0 else math.inf


def p50_speedup(data: dict[str, Any]) -> list[tuple[str, float]]:
    """Affinity's p50 TTFT over affinity + prefix's: how many times lower prefix locality makes it."""
    return [(_label(n, p, a), _ratio(a["ttft_p50_s"], p["ttft_p50_s"])) for n, p, a in _pairs(data)]


def goodput_ratio(data: dict[str, Any]) -> list[tuple[str, float]]:
    return [(_label(n, p, a), _ratio(p["goodput_rps"], a["goodput_rps"])) for n, p, a in _pairs(data)]


def loads_ratio(data: dict[str, Any]) -> list[tuple[str, float]]:
    """Adapter loads (into a slot, from CPU or disk) per 1k requests, affinity + prefix over affinity."""
    return [
        (f"{_label(n, p, a)}: {p['stalls_per_1k']:.0f} vs {a['stalls_per_1k']:.0f}",
         _ratio(p["stalls_per_1k"], a["stalls_per_1k"]))
        for n, p, a in _pairs(data)
    ]  # fmt: skip


def why_p50(data: dict[str, Any]) -> str:
    """The engines' prefix-cache hit rates beside the best any router could reach on the same turns."""
    parts = []
    for name, p, a in _pairs(data):
        scenario = next((s for s in SCENARIOS if s.name == name), None)
        bound = cacheable_fraction(chat_schedule(scenario.workload), SIM_BLOCK_SIZE) if scenario else None
        part = (
            f"{name}: the engines served {100 * a.get('prefix_hit_rate', 0):.1f} % of prompt tokens from the prefix"
            f" cache under lorapool affinity, {100 * p.get('prefix_hit_rate', 0):.1f} % with the prefix scorer"
        )
        if bound is not None:
            part += (
                f", and at most {100 * bound:.1f} % is cacheable (each adapter on one replica, an unbounded cache),"
                " so no router can cut the prefilled tokens by more than"
                f" {(1 - a.get('prefix_hit_rate', 0)) / max(1e-9, 1 - bound):.2f}x"
            )
        parts.append(part)
    return "; ".join(parts)  # fmt: skip
