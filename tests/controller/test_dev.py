"""`lorapool dev --once`, the README's main command, end to end on a fresh state directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.runtime import COMPONENTS
from lorapool_dev.testing.envoy import envoy_or_skip

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(420)
def test_dev_brings_up_a_ready_pool_and_answers_an_adapter_request(tmp_path: Path) -> None:
    if build.missing(cache_root(), COMPONENTS):
        pytest.fail("control plane not built; run scripts/build-control-plane")
    result = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "dev", "--once", "--dir", str(tmp_path / "dev")],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "llama3-8b-engine" in out and "--max-lora-rank  16" in out
    engine_lines = [line for line in out.splitlines() if line.startswith("llama3-8b-engine-")]
    assert len(engine_lines) == 2 and all("gpu-a100-80gb-" in line for line in engine_lines)
    answer, _ = json.JSONDecoder().raw_decode(out[out.index("\n{", out.index("$ curl")) + 1 :])
    assert answer["model"] == "sql-coder" and answer["usage"]["completion_tokens"] > 0
    assert not (tmp_path / "dev" / "cluster").exists() or not any((tmp_path / "dev" / "cluster").glob("*.pid"))


@pytest.mark.timeout(420)
def test_dev_with_the_gateway_answers_through_envoy_and_the_picker(tmp_path: Path) -> None:
    """docs/gateway.md's playground: the rendered InferencePool and picker flags, a real Envoy in front."""
    if build.missing(cache_root(), COMPONENTS):
        pytest.fail("control plane not built; run scripts/build-control-plane")
    envoy_or_skip()
    state = tmp_path / "dev"
    result = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "dev", "--gateway", "envoy", "--once", "--dir", str(state)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "InferencePool for a Gateway's HTTPRoute: ml/llama3-8b" in out
    assert "the rendered flags: --ext-proc-port" in out  # the picker runs the Deployment's own arguments
    through = out.index("Through Envoy and the endpoint picker (server: envoy):")
    answer, _ = json.JSONDecoder().raw_decode(out[out.index("\n{", through) + 1 :])
    assert answer["model"] == "sql-coder" and answer["usage"]["completion_tokens"] > 0
    assert not (state / "gateway-url").exists()  # --once leaves nothing running, nor its URL
