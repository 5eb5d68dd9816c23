"""The sizing cell's pure parts (bench/sizing.py): the schedule, what the sampler shows, the tuning
loop's rule with stand-in runs, one short real simulation, and the RESULTS.md section."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from bench.sizing import (
    CATALOG,
    WORKLOADS,
    RunResult,
    best,
    bounded,
    catalog_plan,
    schedule,
    section,
    simulate,
    tune,
    tuned_share,
    worse,
)
from lorapool.api.report import Observations
from lorapool.plan.sizing import SlotBounds

ZIPF, UNIFORM = WORKLOADS[0], WORKLOADS[1]


def test_the_schedule_is_seeded_and_zipf_is_skewed() -> None:
    assert schedule(ZIPF) == schedule(ZIPF)
    top_zipf = sum(1 for a in schedule(ZIPF) if a.adapter < 10) / len(schedule(ZIPF))
    top_uniform = sum(1 for a in schedule(UNIFORM) if a.adapter < 10) / len(schedule(UNIFORM))
    assert top_zipf > 0.4 and top_uniform < 0.1
    assert all(0 <= a.adapter < CATALOG for a in schedule(UNIFORM))


def test_a_short_simulation_buys_slots_with_kv_cache_and_samples_like_a_sidecar() -> None:
    w = replace(ZIPF, duration_s=40.0, warmup_s=10.0)
    few, many = simulate(w, 8, schedule(w)), simulate(w, 256, schedule(w))
    assert few.kv_tokens - many.kv_tokens == pytest.approx(248 * 704, rel=0.01)  # ~704 KV tokens per r16 slot
    assert few.measured == many.measured > 0
    assert few.windows and all(o.max_loras == 8 and o.samples >= 19 for o in few.windows)
    assert max(o.distinct_max for o in many.windows) > 8  # demand seen past what 8 slots hold


def result(max_loras: int, goodput: float, p99: float, p95: float) -> RunResult:
    obs = Observations(60.0, 100.0, 120, max_loras, p95 / 2, p95, int(p95) + 1, 0.0, 0.0, 0.3, 0.5, 0.6, 50.0, 0.0, 0)
    return RunResult(max_loras, 400_000, goodput, 0.1, p99, 100, 100, 0, 0, [obs])


BOUNDS = SlotBounds(current=134, max_slots=256, n_adapters=320, slot_bytes=92_356_608, kv_per_token_bytes=131_072)


def test_bounded_and_worse() -> None:
    assert (bounded(134, 10), bounded(134, 500), bounded(134, 100)) == (67, 268, 100)
    base = result(134, 2.0, 1.0, 60.0)
    assert worse(result(80, 1.7, 1.0, 60.0), base) and worse(result(80, 2.0, 1.2, 60.0), base)
    assert not worse(result(80, 1.9, 1.05, 60.0), base)


TUNE: dict[str, tuple[dict[int, RunResult], int, list[str]]] = {
    # name: (what each max-loras gives, where tuning ends, the actions of its rounds)
    "shrinks-in-bounded-steps-then-keeps": (
        {134: result(134, 2.0, 1.0, 26.0), 67: result(67, 2.0, 1.0, 26.0), 34: result(34, 2.0, 1.0, 26.0)},
        34,
        ["Shrink", "Shrink", "Keep"],
    ),
    "a-worse-step-is-rolled-back": (
        {134: result(134, 2.0, 1.0, 20.0), 67: result(67, 1.0, 9.0, 20.0)},
        134,
        ["Shrink", "RolledBack"],
    ),
}


@pytest.mark.parametrize(("runs", "ends", "actions"), TUNE.values(), ids=TUNE.keys())
def test_tune(runs: dict[int, RunResult], ends: int, actions: list[str]) -> None:
    final, rounds = tune(134, BOUNDS, runs.__getitem__)
    assert final.max_loras == ends and [r.action for r in rounds] == actions


def cell(name: str, tuned: float, sweep: list[tuple[int, float]]) -> dict[str, Any]:
    def row(m: int, g: float) -> dict[str, Any]:
        return result(m, g, 0.5, 10.0).row()

    return {
        "workload": {"name": name, "about": "x", "rate_rps": 2.0, "prompt_tokens": [1, 2]},
        "requests": 10,
        "static_catalog": row(256, 0.3),
        "static_concurrency": row(134, 1.8),
        "tuned": row(74, tuned),
        "rounds": [{"max_loras": 134, "action": "Shrink", "recommended": 74}],
        "sweep": [row(m, g) for m, g in sweep],
    }


def test_the_section_names_the_rows_and_the_share_of_the_best() -> None:
    c = cell("zipf", 1.8, [(64, 1.8), (128, 2.0), (256, 0.3)])
    assert best(c)["max_loras"] == 128 and tuned_share(c) == pytest.approx(0.9)
    text = "\n".join(section({"date": "d", "command": "c", "wall_s": 1, "slo_ttft_s": 2.0, "workloads": [c]}))
    for word in ("| static (auto, catalog", "| static (auto, concurrency", "| tuned", "| sweep (best) | 128", "90%"):
        assert word in text, word
    assert section(None) == [] and math.isnan(tuned_share(cell("z", 1.0, [(8, 0.0)])))


def test_the_cells_plan_is_the_products_plan() -> None:
    plan = catalog_plan()
    assert plan.concurrency is not None and plan.max_loras == plan.concurrency.distinct
