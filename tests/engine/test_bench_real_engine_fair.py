"""The real-engine fair-dispatch cell's pure parts: its verdicts and its RESULTS.md section (no engine needed)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repo root holds bench/

from bench.real_engine_fair import FLEET, FLOOD, FLOODED, QUIET, RESULTS_FILE, section, verdicts  # noqa: E402
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_FAIR  # noqa: E402

WELL = ("lora-0001", "lora-0002")


def _run(scenario: str, system: str, goodput: float, p99: dict[str, float], served: dict[str, float]) -> dict[str, Any]:
    per = {m: {"requests": 100, "throughput_rps": served.get(m, 2.0), "ttft_p99_s": p, "within_slo": 1.0}
           for m, p in p99.items()}  # fmt: skip
    throughput = sum(a["throughput_rps"] for a in per.values())
    return {
        "scenario": scenario, "system": system, "requests": 300, "failed": 0, "completed": 300,
        "throughput_rps": throughput, "goodput_rps": goodput, "per_adapter": per,
    }  # fmt: skip


QUIET_P99 = {FLOOD: 0.1, WELL[0]: 0.1, WELL[1]: 0.2}
RUNS = [
    _run(QUIET.name, LORAPOOL_FAIR, 6.0, QUIET_P99, {}),
    _run(QUIET.name, LORAPOOL_AFFINITY, 6.0, QUIET_P99, {}),
    # the flood asks more than a third of what was served: its max-min share is what is left over
    _run(FLOODED.name, LORAPOOL_FAIR, 9.0, {FLOOD: 0.5, WELL[0]: 0.15, WELL[1]: 0.3}, {FLOOD: 5.0}),
    _run(FLOODED.name, LORAPOOL_AFFINITY, 10.0, {FLOOD: 0.3, WELL[0]: 0.5, WELL[1]: math.inf}, {FLOOD: 6.0}),
]


def test_verdicts_judge_each_well_behaved_adapter_against_itself() -> None:
    v = verdicts(RUNS)
    assert math.isclose(v[LORAPOOL_FAIR]["worst_p99_ratio"], 1.5) and v[LORAPOOL_FAIR]["worst_adapter"] == WELL[0]
    assert v[LORAPOOL_AFFINITY]["worst_p99_ratio"] == math.inf  # a failed request is the worst
    assert v[LORAPOOL_AFFINITY]["worst_adapter"] == WELL[1]
    assert v[LORAPOOL_FAIR]["goodput_vs_affinity"] == 0.9
    # 100 requests each in a 300/9-s window: equal demands of 3 req/s, so the flood's share is 3 of 9 req/s
    assert math.isclose(v[LORAPOOL_FAIR]["flood_share"], 5.0 / 3.0)


def test_a_failed_run_is_left_out_not_fatal() -> None:
    runs = [*RUNS[:2], {"scenario": FLOODED.name, "system": LORAPOOL_FAIR, "error": "RuntimeError('x')"}, RUNS[3]]
    v = verdicts(runs)
    assert set(v) == {LORAPOOL_AFFINITY}
    assert v[LORAPOOL_AFFINITY]["goodput_vs_affinity"] == 1.0


def test_section_renders_every_run_and_the_verdicts(tmp_path: Path) -> None:
    assert section(tmp_path) == []  # never measured: no section
    data = {
        "command": "python bench/run.py --real-engine-fair", "date": "2026-12-07 03:40 UTC", "machine": "x86_64, 2 cores",
        "scenarios": [{"name": QUIET.name, "about": QUIET.about}, {"name": FLOODED.name, "about": FLOODED.about}],
        "fleet": {"adapters": FLEET.adapters}, "runs": RUNS, "verdicts": verdicts(RUNS),
    }  # fmt: skip
    (tmp_path / RESULTS_FILE).write_text(json.dumps(data))
    text = "\n".join(section(tmp_path))
    assert f"| real-f-flood | {LORAPOOL_AFFINITY} | 300 | 0 | 10.00 | 300 ms | 500 ms | failed |" in text
    assert f"| {LORAPOOL_FAIR} | 1.50x (lora-0001) | 1.67x | 0.90x |" in text
