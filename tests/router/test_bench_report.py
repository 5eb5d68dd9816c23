"""RESULTS.md is written wholly by bench/report.py: rebuilt from results.json it is the same file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repo root holds bench/

from bench.report import render  # noqa: E402
from bench.results import merge  # noqa: E402
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN, ORACLE  # noqa: E402
from bench.targets import TARGETS, Target  # noqa: E402


def test_results_md_is_regenerated_byte_for_byte() -> None:
    data = json.loads((REPO / "bench" / "results" / "results.json").read_text())
    committed = (REPO / "bench" / "RESULTS.md").read_text()
    assert render(data) == committed, "RESULTS.md differs from results.json: run `python bench/run.py --report-only`"


def _run(system: str, goodput: float, p99: float, scenario: str = "a-x") -> dict[str, Any]:
    return {"scenario": scenario, "system": system, "goodput_rps": goodput, "ttft_p99_s": p99}


def _data(*runs: dict[str, Any], regime: str = "a") -> dict[str, Any]:
    return {"scenarios": [{"name": "a-x", "regime": regime}], "runs": list(runs)}


def _target(start: str) -> Target:
    return next(t for t in TARGETS if t.what.startswith(start))


@pytest.mark.parametrize(
    ("target", "data", "verdict"),
    [
        ("regime (a): affinity's goodput", _data(_run(LORAPOOL_AFFINITY, 30, 1), _run(LORAPOOL_ROUND_ROBIN, 10, 3)), "met"),
        ("regime (a): affinity's goodput", _data(_run(LORAPOOL_AFFINITY, 14, 1), _run(LORAPOOL_ROUND_ROBIN, 10, 3)), "missed"),
        ("regime (a): affinity's goodput", _data(_run(LORAPOOL_AFFINITY, 30, 1)), "not measured"),
        ("regime (a): affinity's goodput", _data(_run(LORAPOOL_AFFINITY, 30, 1), _run(LORAPOOL_ROUND_ROBIN, 10, 3), regime="b"), "not measured"),
        ("regime (c)", _data(_run(LORAPOOL_AFFINITY, 9, 0.104), _run("nginx round-robin", 9, 0.1), regime="c"), "met"),
        ("regime (c)", _data(_run(LORAPOOL_AFFINITY, 9, 0.106), _run("nginx round-robin", 9, 0.1), regime="c"), "missed"),
        ("affinity's goodput as a fraction", _data(_run(LORAPOOL_AFFINITY, 9.4, 1), _run(ORACLE, 10, 1)), "met"),
        ("affinity's goodput as a fraction", _data(_run(LORAPOOL_AFFINITY, 9.2, 1), _run(ORACLE, 10, 1)), "missed"),
        ("every scenario: affinity's p99", _data(_run(LORAPOOL_AFFINITY, 9, 1.0), _run(ORACLE, 10, 0.1), _run("x", 1, 0.99)), "met"),
        ("router overhead", {"overhead": {"rates": {"500": {LORAPOOL_AFFINITY: {"added_p99_ms": 1.4}, "nginx round-robin": {"added_p99_ms": 1.0}}}}}, "met"),
        ("router overhead", {"overhead": {"rates": {"500": {LORAPOOL_AFFINITY: {"added_p99_ms": 1.6}, "nginx round-robin": {"added_p99_ms": 1.0}}}}}, "missed"),
        ("router overhead", {"overhead": {"rates": {"500": {LORAPOOL_AFFINITY: {"added_p99_ms": 0.9}}}}}, "met"),
    ],
    ids=[
        "3x goodput meets 1.5x", "1.4x misses", "no round-robin cell", "other regime",
        "c within 5 %", "c 6 % worse", "94 % of oracle", "92 % of oracle", "oracle is no baseline",
        "within nginx + 0.5", "beyond nginx + 0.5", "under 1 ms alone",
    ],
)  # fmt: skip
def test_verdicts_come_from_the_numbers(target: str, data: dict[str, Any], verdict: str) -> None:
    assert _target(target).verdict(data)[1] == verdict


def test_merge_replaces_remeasured_cells_and_keeps_the_rest() -> None:
    old = {
        "date": "d1", "command": "c1", "machine": "m",
        "scenarios": [{"name": "a-x"}], "runs": [_run("s1", 1, 1), _run("s2", 2, 2)],
    }  # fmt: skip
    fresh = {"scenarios": [{"name": "a-x"}, {"name": "c-y"}], "runs": [_run("s2", 5, 5), _run("s1", 3, 3, "c-y")]}
    merged = merge(old, fresh, {"date": "d2", "command": "c2", "machine": "m"})
    assert [(r["scenario"], r["system"], r["goodput_rps"]) for r in merged["runs"]] == [
        ("a-x", "s1", 1), ("a-x", "s2", 5), ("c-y", "s1", 3),
    ]  # fmt: skip
    assert [s["date"] for s in merged["sessions"]] == ["d1", "d2"]
    assert [s["name"] for s in merged["scenarios"]] == ["a-x", "c-y"]


def _loaded(system: str, goodput: float, stalls: float, disk: float) -> dict[str, Any]:
    return {**_run(system, goodput, 1.0), "stalls_per_1k": stalls, "disk_loads_per_1k": disk}


def test_a_missed_target_says_its_measured_cause_from_the_same_results() -> None:
    target = _target("affinity's goodput as a fraction")
    missed = _data(_loaded(LORAPOOL_AFFINITY, 7.2, 572, 404), _loaded(ORACLE, 10, 0, 0))
    met = _data(_loaded(LORAPOOL_AFFINITY, 9.5, 12, 0), _loaded(ORACLE, 10, 0, 0))
    assert target.verdict(missed)[1] == "missed" and target.why is not None
    assert "a-x 0.72: affinity waits on 572 adapter loads per 1,000 requests (404 of them from disk)" in target.why(
        missed
    )
    assert target.verdict(met)[1] == "met" and target.why(met) == ""


def test_results_md_gives_a_cause_for_each_missed_target_that_has_one() -> None:
    data = json.loads((REPO / "bench" / "results" / "results.json").read_text())
    text = render(data)
    for t in TARGETS:
        if t.why is not None and t.verdict(data)[1] == "missed" and t.why(data):
            assert f"- **{t.what}** (issue {t.issue}): " in text
