"""The CI budget table: each test lands in its tier, a tier over budget is named, the plugin records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorapool_dev.testing.tiers import BY_NAME, TIMES_ENV, TOTAL_COLD_S, Measured, table, tier_of, verdict


@pytest.mark.parametrize(
    ("path", "markers", "tier"),
    [
        ("tests/e2e/test_e2e.py", ["cluster", "slow"], "e2e"),
        ("tests/engine/test_sidecar_real.py", ["engine"], "engine"),
        ("tests/conformance/test_conformance.py", ["engine", "cluster"], "engine"),
        ("tests/controller/test_operator.py", ["cluster"], "cluster"),
        ("tests/cluster/test_pure.py", [], "unit"),
        ("tests/router/test_plugins.py", ["slow"], "unit"),
        ("tests/image/test_images.py", ["images"], "images"),
        ("tests/image/test_recipe.py", [], "unit"),
        ("tests/router/test_extproc_envoy.py", ["envoy"], "envoy"),
        ("tests/node/test_real_node.py", ["node", "slow"], "node"),
    ],
    ids=[
        "e2e by place",
        "engine",
        "engine wins over cluster",
        "cluster",
        "a cluster dir's pure test",
        "slow unit",
        "images",
        "the images' pure core",
        "envoy",
        "the real node",
    ],
)
def test_tier_of(path: str, markers: list[str], tier: str) -> None:
    assert tier_of(path, markers) == tier


def test_a_tier_over_its_budget_is_named_with_by_how_much() -> None:
    unit = BY_NAME["unit"]
    assert verdict(Measured("unit", unit.warm_s - 1, cold=False)) == "ok"
    over = verdict(Measured("unit", unit.warm_s + 30, cold=False))
    assert over.startswith("OVER BUDGET by 30 s") and "warm budget" in over
    build = BY_NAME["control-plane build"]
    assert verdict(Measured("control-plane build", build.warm_s + 60, cold=True)) == "ok"  # a cold build may take long
    assert "no budget" in verdict(Measured("real node", 1, cold=False))


def test_the_table_sums_and_says_cold() -> None:
    lines = table([Measured("control-plane build", TOTAL_COLD_S, cold=True), Measured("unit", 60, cold=False)])
    assert any(line.startswith("control-plane build (cold)") for line in lines)
    assert lines[-1].startswith("total (cold)") and "OVER BUDGET by 60 s" in lines[-1]


def test_the_plugin_records_each_tier(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import time, pytest\ndef test_fast(): pass\n@pytest.mark.cluster\ndef test_cluster(): time.sleep(0.2)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cluster: x\n")
    times = tmp_path / "times.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "lorapool_dev.testing.tiers",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, TIMES_ENV: str(times)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tiers = json.loads(times.read_text())["tiers"]
    assert tiers["unit"]["tests"] == 1 and tiers["cluster"]["tests"] == 1
    assert tiers["cluster"]["seconds"] >= 0.2 > tiers["unit"]["seconds"]
