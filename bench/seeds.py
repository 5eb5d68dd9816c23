"""Regime (b) over several seeds: fair dispatch's gap to the oracle beside affinity's (issue 27).

One 250-request cell of ``b-zipf-poisson`` moves by about 10 % between identical runs, more than
the difference the target asks about, so a single run cannot say whether fair dispatch costs
regime (b) anything. This cell replays the scenario with ``SEEDS`` workload seeds (other arrival
times and adapter draws, the same rates and mix) and, per seed, runs ``lorapool fair``,
``lorapool affinity`` and the oracle back to back, each on fresh replicas; the target reads the
median over seeds of the per-seed ratio (fairness_report.oracle_gap). Folded into results.json as
``seeds``, so ``--report-only`` and the Targets table read it from the same file as every cell.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import results
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_FAIR, ORACLE, SCENARIOS, Scenario
from bench.systems import System

SCENARIO = "b-zipf-poisson"
SEEDS = 3
SEED_STRIDE = 100  # loadgen draws from seed and seed + 1: strided seeds share no stream
COMPARED = (LORAPOOL_FAIR, LORAPOOL_AFFINITY, ORACLE)
KEPT = ("goodput_rps", "throughput_rps", "ttft_p50_s", "ttft_p99_s", "stalls_per_1k", "requests", "failed")


def seeded(scenario: Scenario, i: int) -> Scenario:
    """The scenario with its workload's i-th seed (0: the recorded one)."""
    return replace(scenario, workload=replace(scenario.workload, seed=scenario.workload.seed + SEED_STRIDE * i))


def run(
    out: Path,
    adapter_root: Path,
    stamp: dict[str, str],
    systems: list[System],
    run_one: Callable[[Scenario, System, Path], dict[str, Any]],
) -> dict[str, Any]:
    """Measure every seed x compared system into OUT/results.json's ``seeds``; return the file's data."""
    scenario = next(s for s in SCENARIOS if s.name == SCENARIO)
    compared = [s for s in systems if s.name in COMPARED]
    cells = []
    for i in range(SEEDS):
        variant = seeded(scenario, i)
        for system in compared:
            try:
                summary = run_one(variant, system, adapter_root)
                cell = {"seed": variant.workload.seed, "system": system.name, **{k: summary[k] for k in KEPT}}
            except Exception as exc:  # reported in the file, not fatal
                cell = {"seed": variant.workload.seed, "system": system.name, "error": repr(exc)[:500]}
            cells.append(cell)
            print(json.dumps(cell), flush=True)
    data = results.load(out, stamp)
    data["seeds"] = {"scenario": SCENARIO, **stamp, "cells": cells}
    results.save(out, data)
    return data


def per_seed(data: dict[str, Any], scenario: str) -> dict[int, dict[str, dict[str, Any]]]:
    """seed -> system -> cell of the ``seeds`` record for ``scenario``, failed cells left out."""
    record = data.get("seeds") or {}
    if record.get("scenario") != scenario:
        return {}
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for cell in record.get("cells", []):
        if "error" not in cell:
            out.setdefault(int(cell["seed"]), {})[cell["system"]] = cell
    return out
