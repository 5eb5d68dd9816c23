"""``lorapool sim --vllm-version``: each supported release's behaviour where releases differ,
through the real simulator process and real HTTP (api.vllm_versions.SUPPORTED drives the params)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lorapool.api.vllm_metrics import parse_metrics
from lorapool.api.vllm_versions import SUPPORTED, VllmRelease
from lorapool_dev.testing.scrape import metric_value
from tests.sim.conftest import Sim, StartSim

LOAD = "/v1/load_lora_adapter"
RELEASES = [pytest.param(r, id=r.version) for r in SUPPORTED.values()]


def start(start_sim: StartSim, version: str) -> Sim:
    return start_sim("--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--time-scale", "0",
                     "--vllm-version", version)  # fmt: skip


def disk_loads(sim: Sim) -> float:
    return metric_value(sim.metrics(), "sim:lora_loads_total", **{"from": "disk"})


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("spelling", ["family", "version"])
def test_version_answers_the_release(start_sim: StartSim, release: VllmRelease, spelling: str) -> None:
    sim = start(start_sim, release.family if spelling == "family" else release.version)
    status, text = sim.request("GET", "/version")
    version = json.loads(text)["version"]
    assert status == 200
    assert version.startswith(f"{release.version}+lorapool.sim.")
    # the one metrics reader reads the page by that release's row
    assert parse_metrics(sim.metrics(), version).family == release.family


@pytest.mark.parametrize("release", RELEASES)
def test_in_place_reload_rereads_from_disk_only_where_the_flag_sticks(
    start_sim: StartSim, adapters: Callable[..., Path], release: VllmRelease
) -> None:
    sim = start(start_sim, release.version)
    first, second = adapters("inplace-v1", rank=8), adapters("inplace-v2", rank=8, seed=1)
    plain = adapters("plain", rank=8, seed=2)
    assert sim.post(LOAD, {"lora_name": "inplace", "lora_path": str(first)})[0] == 200
    assert sim.post(LOAD, {"lora_name": "inplace", "lora_path": str(second), "load_inplace": True})[0] == 200
    assert sim.post(LOAD, {"lora_name": "plain", "lora_path": str(plain)})[0] == 200
    requests = 3
    before = disk_loads(sim)
    for _ in range(requests):
        sim.client().completions.create(model="plain", prompt="hi", max_tokens=2)
    assert disk_loads(sim) == before  # an adapter loaded plainly stays resident on every release
    for _ in range(requests):
        sim.client().completions.create(model="inplace", prompt="hi", max_tokens=2)
    rereads = disk_loads(sim) - before
    if release.inplace_flag_sticks:
        assert rereads >= requests  # every step that runs it re-reads it: at least one per request
    else:
        assert rereads == 0


def test_an_unsupported_version_is_a_clear_cli_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "sim", "--vllm-version", "0.33"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    supported = ", ".join(f"{r.family} ({r.version})" for r in SUPPORTED.values())
    assert f"--vllm-version: '0.33' is not a supported vLLM release; supported: {supported}" in result.stderr
    assert "Traceback" not in result.stderr
