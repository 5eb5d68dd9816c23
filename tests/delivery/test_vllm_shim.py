"""e2e/vllm_shim.py: the `vllm` of the simulator image. The process test starts it with exactly
the command and flags the renderer gives the engine container, as the kind e2e pod does."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import free_port, start_process
from tests.delivery.helm import REPO

SHIM = REPO / "e2e" / "vllm_shim.py"


def _load_shim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_shim", SHIM)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shim = _load_shim()


@pytest.mark.parametrize(
    ("argv", "args", "dropped"),
    [
        (["serve", "org/m", "--port", "8000"], ["--model", "org/m", "--port", "8000"], []),
        (
            ["serve", "org/m", "--dtype", "auto", "--enable-lora"],
            ["--model", "org/m", "--enable-lora"],
            ["--dtype auto"],
        ),
        (
            ["serve", "m", "--tensor-parallel-size", "2", "-tp", "2"],
            ["--model", "m"],
            ["--tensor-parallel-size 2", "-tp 2"],
        ),
        (
            ["serve", "m", "--lora-dtype=bfloat16", "--max-loras", "8"],
            ["--model", "m", "--max-loras", "8"],
            ["--lora-dtype=bfloat16"],
        ),
        (
            ["serve", "m", "--lora-target-modules", "q_proj", "v_proj", "--max-lora-rank", "16"],
            ["--model", "m", "--max-lora-rank", "16"],
            ["--lora-target-modules q_proj v_proj"],
        ),
        (
            ["serve", "s3://b/m", "--load-format", "runai_streamer", "--revision", "abc"],
            ["--model", "s3://b/m"],
            ["--load-format runai_streamer", "--revision abc"],
        ),
        (["serve", "--model", "m", "--unknown-flag", "1"], ["--model", "m", "--unknown-flag", "1"], []),
    ],
    ids=[
        "model-positional",
        "dtype",
        "tensor-parallel",
        "lora-dtype-equals",
        "target-modules-nargs",
        "s3-revision",
        "unknown-passes-through",
    ],
)
def test_translate(argv: list[str], args: list[str], dropped: list[str]) -> None:
    out, notes = shim.translate(argv)
    assert out == args
    assert notes == [f"vllm shim: the simulator ignores {d}" for d in dropped]


@pytest.mark.parametrize("argv", [[], ["chat"], ["--help"]], ids=["nothing", "other-subcommand", "flag-only"])
def test_anything_but_serve_is_refused(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, str(SHIM), *argv], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "vllm serve MODEL" in result.stderr


def rendered_engine(tmp_path: Path) -> dict[str, Any]:
    """The engine container `lorapool render` emits for the README's example pool."""
    out = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "render", "-f", str(REPO / "examples" / "lorapool.yaml")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    engine = next(
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-engine")
    )
    return next(c for c in engine["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.slow
def test_simulator_serves_with_every_flag_the_renderer_emits(tmp_path: Path) -> None:
    container = rendered_engine(tmp_path)
    assert container["command"] == ["vllm", "serve"]
    args = list(container["args"])
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args[args.index("--host") + 1] = "127.0.0.1"
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"
    base = f"http://127.0.0.1:{port}"
    with start_process(
        [sys.executable, str(SHIM), *container["command"][1:], *args], f"{base}/health", 60, env=env
    ) as proc:
        served = args[args.index("--served-model-name") + 1]
        models = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=10).read())
        assert [m["id"] for m in models["data"]] == [served]
        adapter = write_peft_adapter(tmp_path / "sql-coder", rank=16, base_model=served)
        status, text = post(f"{base}/v1/load_lora_adapter", {"lora_name": "sql-coder", "lora_path": str(adapter)})
        assert status == 200, text
        status, text = post(f"{base}/v1/completions", {"model": "sql-coder", "prompt": "SELECT", "max_tokens": 4})
        assert status == 200, text
        assert json.loads(text)["model"] == "sql-coder"
        output = proc.output()
    for flag in ("--dtype auto", "--tensor-parallel-size 1", "--lora-dtype auto"):
        assert f"vllm shim: the simulator ignores {flag}" in output
    # The flags the simulator does model reach it: the rendered slots and rank show in its log.
    assert "max_loras=8" in output and "max_lora_rank=16" in output
