"""The real-engine benchmark cell's pure parts: ratios and the RESULTS.md section (no engine needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repo root holds bench/

from bench.real_engine import RESULTS_FILE, SCENARIO, ratios, section  # noqa: E402
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN  # noqa: E402


def _run(engine: str, system: str, loads: float, p50: float, p99: float) -> dict[str, Any]:
    return {
        "engine": engine, "system": system, "requests": 300, "failed": 0, "loads_per_1k": loads,
        "ttft_p50_s": p50, "ttft_p99_s": p99,
    }  # fmt: skip


RUNS = [
    _run("vllm", LORAPOOL_AFFINITY, 100.0, 0.05, 0.4),
    _run("vllm", LORAPOOL_ROUND_ROBIN, 400.0, 0.10, 0.8),
    _run("sim", LORAPOOL_AFFINITY, 50.0, 0.02, 0.1),
    {"engine": "sim", "system": LORAPOOL_ROUND_ROBIN, "error": "RuntimeError('did not start')"},
]


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("vllm", {"loads_per_1k": 0.25, "ttft_p50_s": 0.5, "ttft_p99_s": 0.5}),
        ("sim", {"loads_per_1k": None, "ttft_p50_s": None, "ttft_p99_s": None}),  # a failed run gives no ratio
    ],
)
def test_ratios_are_affinity_over_round_robin(engine: str, expected: dict[str, float | None]) -> None:
    assert ratios(RUNS, engine) == expected


def test_section_renders_both_engines_side_by_side(tmp_path: Path) -> None:
    assert section(tmp_path) == []  # never measured: no section
    data = {
        "command": "python bench/run.py --real-engine", "date": "2026-12-02 20:40 UTC", "machine": "x86_64, 2 cores",
        "scenario": {"about": SCENARIO.about}, "runs": RUNS,
        "ratios": {"vllm": ratios(RUNS, "vllm"), "sim": ratios(RUNS, "sim")},
    }  # fmt: skip
    (tmp_path / RESULTS_FILE).write_text(json.dumps(data))
    text = "\n".join(section(tmp_path))
    assert "| vllm | lorapool affinity | 300 | 0 | 100 | 50 ms | 400 ms |" in text
    assert "| sim | lorapool round-robin | error: RuntimeError('did not start')" in text
    assert "| LoRA loads per 1k | 0.25x | n/a |" in text
    assert "| TTFT p99 | 0.50x | n/a |" in text
    assert "as a multiple of vLLM's: lorapool affinity 0.50x, lorapool round-robin n/a." in text
