"""Regime (f)'s workload and verdicts: the flood adds to the very same arrivals, and the cells are
computed from per-adapter results as the targets say (max-min share, worst ratio, SLO share)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repo root holds bench/

from bench import fairness_report as fair  # noqa: E402
from bench.loadgen import Outcome, flood_schedule, noisy_schedule, per_adapter  # noqa: E402
from bench.scenarios import F_CRITICAL, F_FLOOD, LORAPOOL_AFFINITY, LORAPOOL_FAIR, ORACLE, SCENARIOS  # noqa: E402
from bench.targets import TARGETS  # noqa: E402

QUIET, FLOOD = (next(s for s in SCENARIOS if s.name == n) for n in ("f-quiet", "f-flood"))


def test_the_flood_adds_ten_times_its_share_in_bursts_to_the_same_arrivals() -> None:
    quiet, flood = noisy_schedule(QUIET.workload), noisy_schedule(FLOOD.workload)
    others = [p for p in flood if p not in set(flood_schedule(FLOOD.workload))]
    assert others == quiet  # request for request, so each adapter's p99 compares with itself
    counts = Counter(p.model for p in flood)
    share = len(quiet) / FLOOD.workload.adapters
    assert 8 * share <= counts[F_FLOOD] <= 12 * share
    w = FLOOD.workload
    assert all((p.at_s % w.period_s) < w.burst_s for p in flood_schedule(w))  # only within bursts
    with pytest.raises(ValueError, match="popularity=uniform"):
        flood_schedule(replace(w, popularity="zipf"))


@pytest.mark.parametrize(
    ("demands", "capacity", "key", "want"),
    [
        ({"a": 1, "b": 1, "flood": 10}, 12, "flood", 10),  # enough for everyone: its demand
        ({"a": 1, "b": 1, "flood": 10}, 6, "flood", 4),  # the light ones in full, the rest to it
        ({"a": 1, "b": 1, "flood": 10}, 6, "a", 1),
        ({"a": 5, "b": 5, "flood": 10}, 6, "flood", 2),  # nobody in full: equal parts
        ({"a": 5, "b": 5, "flood": 10}, 6, "a", 2),
    ],
)
def test_max_min_share(demands: dict[str, float], capacity: float, key: str, want: float) -> None:
    assert fair.max_min_share(demands, capacity, key) == pytest.approx(want)


def outcomes(model: str, ttfts: list[float | None]) -> list[Outcome]:
    return [
        Outcome(model, 0.0, status=200 if t is not None else 503, ttft_s=t, done_s=1.0 if t is not None else None)
        for t in ttfts
    ]


def test_per_adapter_counts_failures_as_infinite_and_outside_the_slo() -> None:
    stats = per_adapter([*outcomes("a", [0.1] * 9 + [None]), *outcomes("b", [0.2, 0.9])], window_s=2, slo_ttft_s=0.5)
    assert stats["a"] == {"requests": 10, "throughput_rps": 4.5, "ttft_p99_s": math.inf, "within_slo": 0.9}
    assert stats["b"]["ttft_p99_s"] == 0.9 and stats["b"]["within_slo"] == 0.5


def cell(system: str, scenario: str, p99: dict[str, float], **kw: Any) -> dict[str, Any]:
    adapters = {m: {"requests": 10, "throughput_rps": 1.0, "ttft_p99_s": v, "within_slo": 1.0} for m, v in p99.items()}
    return {"scenario": scenario, "system": system, "date": "d", "per_adapter": adapters, **kw}


def test_the_regime_f_targets_read_their_cells() -> None:
    quiet = {"x": 0.2, "y": 0.4, F_FLOOD: 0.2, F_CRITICAL: 0.1}
    flood = {"x": 0.22, "y": 0.6, F_FLOOD: 3.0, F_CRITICAL: 0.1}
    run = {"requests": 40, "completed": 40, "throughput_rps": 4.0, "goodput_rps": 3.8}
    data = {
        "scenarios": [{"name": "f-quiet", "regime": "f"}, {"name": "f-flood", "regime": "f"}],
        "runs": [
            cell(LORAPOOL_FAIR, "f-quiet", quiet, **run),
            cell(LORAPOOL_FAIR, "f-flood", flood, **run),
            cell(LORAPOOL_AFFINITY, "f-flood", flood, **{**run, "goodput_rps": 3.0}),
        ],
    }
    f_targets = [t for t in TARGETS if t.what.startswith("regime (f): ")]
    assert len(f_targets) == 5
    (worst,) = fair.p99_cells(LORAPOOL_FAIR)(data)
    assert worst == (f"{LORAPOOL_FAIR}, worst: y", pytest.approx(1.5))  # the flood itself is not judged
    assert f_targets[0].verdict(data)[1] == "missed"
    assert fair.goodput_vs_affinity(data)[0][1] == pytest.approx(3.8 / 3.0)
    assert fair.critical_within_slo(data)[0][1] == 1.0
    # 4 adapters each sent 10 requests and got 1 req/s over the 10 s window: the flood's share is 1 req/s
    assert fair.flood_share(data)[0][1] == pytest.approx(1.0)
    assert fair.oracle_gap(data) == []  # regime (b) not measured with fair dispatch here
    assert f_targets[4].verdict(data)[1] == "not measured"


def _b(system: str, goodput: float, **extra: Any) -> dict[str, Any]:
    return {"scenario": "b-zipf-poisson", "system": system, "goodput_rps": goodput, **extra}


def test_regime_b_s_gap_is_the_median_over_seeds_when_the_seeds_cell_has_two_or_more() -> None:
    single = {
        "scenarios": [{"name": "b-zipf-poisson", "regime": "b"}],
        "runs": [_b(LORAPOOL_FAIR, 17.0), _b(LORAPOOL_AFFINITY, 19.0), _b(ORACLE, 25.0)],
    }
    [(label, ratio)] = fair.oracle_gap(single)
    assert label == "b-zipf-poisson: 0.68 vs 0.76" and ratio == pytest.approx(17 / 19)
    per_seed = [(7, 18.0, 20.0, 25.0), (107, 20.0, 20.0, 24.0), (207, 21.0, 19.0, 26.0)]
    cells = [
        {"seed": seed, **_b(system, goodput)}
        for seed, *goodputs in per_seed
        for system, goodput in zip((LORAPOOL_FAIR, LORAPOOL_AFFINITY, ORACLE), goodputs, strict=True)
    ]
    cells.append({"seed": 307, "system": LORAPOOL_FAIR, "error": "RuntimeError('x')"})  # a failed seed: left out
    seeded = {**single, "seeds": {"scenario": "b-zipf-poisson", "date": "2026-12-07 08:30 UTC", "cells": cells}}
    [(label, ratio)] = fair.oracle_gap(seeded)
    assert ratio == pytest.approx(1.0)  # the median of 0.90, 1.00 and 1.11, not the single run's 0.89
    assert label.startswith("b-zipf-poisson, median of 3 seeds (seed 7 0.72 vs 0.80,") and "08:30" in label
    other = {**single, "seeds": {"scenario": "b-zipf-gamma", "cells": cells}}
    assert fair.oracle_gap(other) == fair.oracle_gap(single)  # another scenario's seeds do not count
    one = {**single, "seeds": {"scenario": "b-zipf-poisson", "cells": cells[:3]}}
    assert fair.oracle_gap(one) == fair.oracle_gap(single)  # one seed is no median
