"""Regime (g)'s target cells (bench/prefix_report.py): affinity + prefix against affinity, from results.json."""

from __future__ import annotations

import math
from typing import Any

from bench.prefix_report import goodput_ratio, loads_ratio, p50_speedup, why_p50
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_PREFIX, LORAPOOL_ROUND_ROBIN


def _run(scenario: str, system: str, p50: float, goodput: float, loads: float, **extra: Any) -> dict[str, Any]:
    return {"scenario": scenario, "system": system, "ttft_p50_s": p50, "goodput_rps": goodput,
            "stalls_per_1k": loads, **extra}  # fmt: skip


def _data(*runs: dict[str, Any]) -> dict[str, Any]:
    return {"scenarios": [{"name": "g-chat", "regime": "g"}, {"name": "a-uniform", "regime": "a"}], "runs": list(runs)}


def test_cells_compare_prefix_with_affinity_in_each_chat_scenario_only() -> None:
    data = _data(
        _run("g-chat", LORAPOOL_PREFIX, 0.1, 19.0, 40.0),
        _run("g-chat", LORAPOOL_AFFINITY, 0.3, 20.0, 50.0),
        _run("g-chat", LORAPOOL_ROUND_ROBIN, 0.9, 10.0, 500.0),
        _run("a-uniform", LORAPOOL_PREFIX, 1.0, 1.0, 1.0),  # not a chat regime: no cell
        _run("a-uniform", LORAPOOL_AFFINITY, 2.0, 1.0, 1.0),
    )
    [(label, speedup)] = p50_speedup(data)
    assert label == "g-chat" and math.isclose(speedup, 3.0)
    assert goodput_ratio(data) == [("g-chat", 0.95)]
    assert loads_ratio(data) == [("g-chat: 40 vs 50", 0.8)]


def test_no_loads_on_either_side_is_no_worse_and_a_missing_or_failed_run_gives_no_cell() -> None:
    both = _data(_run("g-chat", LORAPOOL_PREFIX, 0.1, 1.0, 0.0), _run("g-chat", LORAPOOL_AFFINITY, 0.1, 1.0, 0.0))
    assert loads_ratio(both) == [("g-chat: 0 vs 0", 1.0)]
    worse = _data(_run("g-chat", LORAPOOL_PREFIX, 0.1, 1.0, 3.0), _run("g-chat", LORAPOOL_AFFINITY, 0.1, 1.0, 0.0))
    assert loads_ratio(worse)[0][1] == math.inf
    failed = _data(
        {"scenario": "g-chat", "system": LORAPOOL_PREFIX, "error": "RuntimeError('x')"},
        _run("g-chat", LORAPOOL_AFFINITY, 0.1, 1.0, 0.0),
    )
    assert p50_speedup(failed) == [] and p50_speedup(_data()) == []


def test_cells_from_two_runs_say_so() -> None:
    data = _data(
        _run("g-chat", LORAPOOL_PREFIX, 0.1, 1.0, 1.0, date="2026-12-07 04:00 UTC"),
        _run("g-chat", LORAPOOL_AFFINITY, 0.2, 1.0, 1.0, date="2026-12-06 10:00 UTC"),
    )
    assert p50_speedup(data)[0][0] == "g-chat [runs of 2026-12-07 04:00 UTC and 2026-12-06 10:00 UTC]"


def test_a_miss_is_explained_by_the_hit_rates_and_the_bound_of_the_scenario_s_own_turns() -> None:
    data = _data(
        _run("g-chat", LORAPOOL_PREFIX, 0.1, 1.0, 1.0, prefix_hit_rate=0.82),
        _run("g-chat", LORAPOOL_AFFINITY, 0.1, 1.0, 1.0, prefix_hit_rate=0.80),
    )
    why = why_p50(data)
    assert "80.0 %" in why and "82.0 %" in why and "at most" in why
    bound = float(why.split("at most ")[1].split(" %")[0]) / 100
    assert 0.80 < bound < 1.0  # g-chat's turns: more than affinity served, never all
    assert "no router can cut the prefilled tokens by more than" in why
    assert why_p50(_data()) == ""
