"""`lorapool dev --engine vllm --once`: the playground's data plane on real vLLM CPU replicas."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.runtime import COMPONENTS
from lorapool_dev.engine.fixtures import engine_or_skip
from lorapool_dev.engine.playground import stand_in_note, tiny_sources

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"  # examples/lorapool.yaml


def test_tiny_sources_replace_only_what_the_machine_cannot_fetch(tmp_path: Path) -> None:
    doc = {
        "spec": {
            "baseModel": {"name": BASE},
            "adapters": [
                {"name": "remote", "source": "hf://acme/x", "rank": 16},
                {"name": "mine", "source": "file:///data/mine"},
                {"name": "bucket", "source": "s3://b/p/"},
            ],
        }
    }
    replaced = tiny_sources(doc, tmp_path)
    assert replaced == [("remote", "hf://acme/x", 16), ("bucket", "s3://b/p/", 8)]
    sources = [a["source"] for a in doc["spec"]["adapters"]]  # type: ignore[index]
    assert sources[1] == "file:///data/mine"
    config = json.loads((tmp_path / "remote" / "adapter_config.json").read_text())
    assert sources[0] == (tmp_path / "remote").as_uri() and config["r"] == 16
    assert config["base_model_name_or_path"] == BASE  # the sidecar's base-model check passes
    assert "TINY" in stand_in_note(BASE) and f"{BASE} itself is not loaded" in stand_in_note(BASE)


@pytest.mark.engine
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_dev_engine_vllm_answers_an_adapter_request_from_real_vllm(tmp_path: Path) -> None:
    engine_or_skip()
    if build.missing(cache_root(), COMPONENTS):
        pytest.fail("control plane not built; run scripts/build-control-plane")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lorapool.cli", "dev", "--engine", "vllm", "--once", "--dir", str(tmp_path / "dev")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=560)
    finally:
        proc.kill()
        proc.wait()
    left = [cmd for cmd in _cmdlines() if str(tmp_path) in cmd or ("vllm" in cmd and "serve" in cmd and BASE in cmd)]
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    assert "real vLLM (CPU) replicas serving a TINY" in out
    assert "Starting a vLLM (CPU) engine and a reporting sidecar for each of the 2 engine pod(s)" in out
    answer, _ = json.JSONDecoder().raw_decode(out[out.index("\n{", out.index("$ curl")) + 1 :])
    assert answer["model"] == "sql-coder" and answer["usage"]["completion_tokens"] > 0, answer
    assert left == [], f"processes left behind: {left}"


def _cmdlines() -> list[str]:
    out = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return out
