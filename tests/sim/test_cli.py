"""``lorapool sim`` flags: parsing, vLLM's start-up refusals, exit codes, graceful stop."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lorapool.sim.cli import configure, parse_lora_module, runtime_lora_updating_allowed, settings_from_args
from lorapool.sim.timing import TimingParams
from tests.sim.conftest import StartSim


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "sim", *argv], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("true", True),
        ("True", True),
        ("1", True),
        (" TRUE ", True),
        ("false", False),
        ("0", False),
        ("yes", False),
        ("", False),
    ],
)
def test_runtime_updating_env_reads_like_vllm(value: str, allowed: bool) -> None:
    assert runtime_lora_updating_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value}) is allowed
    assert runtime_lora_updating_allowed({}) is False


def test_defaults_follow_vllm_on_an_a100() -> None:
    settings = settings_from_args(parse(), {})
    engine = settings.engine
    assert (engine.max_loras, engine.cpu_capacity, engine.max_lora_rank) == (1, 1, 16)
    assert (engine.max_num_seqs, engine.max_num_batched_tokens, engine.max_model_len) == (256, 2048, 8192)
    assert settings.served_model_names == ("meta-llama/Meta-Llama-3-8B-Instruct",)
    assert settings.timing == TimingParams()
    assert (settings.host, settings.port, settings.time_scale) == ("127.0.0.1", 8000, 1.0)


@pytest.mark.parametrize(
    ("argv", "caching", "details"),
    [
        pytest.param((), True, False, id="defaults-as-vllm-v1"),
        pytest.param(("--no-enable-prefix-caching",), False, False, id="vllm-0.32-off-switch"),
        pytest.param(("--disable-prefix-caching",), False, False, id="vllm-0.34-off-switch"),
        pytest.param(("--no-enable-prefix-caching", "--enable-prefix-caching"), True, False, id="last-wins"),
        pytest.param(("--enable-prompt-tokens-details",), True, True, id="prompt-tokens-details"),
    ],
)
def test_prefix_caching_switches_are_vllms(argv: tuple[str, ...], caching: bool, details: bool) -> None:
    settings = settings_from_args(parse(*argv), {})
    assert (settings.engine.enable_prefix_caching, settings.enable_prompt_tokens_details) == (caching, details)


def test_flags_reach_the_settings() -> None:
    args = parse(
        "--served-model-name", "base", "alias", "--enable-lora", "--max-loras", "4", "--max-cpu-loras", "32",
        "--max-lora-rank", "64", "--decode-step-s-at-1", "0.02", "--natural-output-tokens-max", "64",
        "--num-gpu-blocks-override", "1000", "--time-scale", "0",
    )  # fmt: skip
    settings = settings_from_args(args, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})
    assert settings.served_model_names == ("base", "alias")
    assert (settings.engine.max_loras, settings.engine.cpu_capacity, settings.engine.max_lora_rank) == (4, 32, 64)
    assert settings.engine.num_gpu_blocks == 1000
    assert settings.timing.decode_step_s_at_1 == 0.02
    assert settings.timing.natural_output_tokens_max == 64
    assert settings.allow_runtime_lora_updating
    assert settings.time_scale == 0


def test_more_lora_slots_mean_a_smaller_kv_cache() -> None:
    small = settings_from_args(parse("--enable-lora", "--max-loras", "1"), {}).engine.num_gpu_blocks
    large = settings_from_args(
        parse("--enable-lora", "--max-loras", "32", "--max-lora-rank", "64"), {}
    ).engine.num_gpu_blocks
    assert large < small


@pytest.mark.parametrize(
    ("spec", "name", "path"),
    [
        ("sql=/a/b", "sql", "/a/b"),
        ('{"name": "x", "path": "/p", "base_model_name": "m"}', "x", "/p"),
        ("a=b=c", "a", "b=c"),
    ],
)
def test_lora_module_forms(spec: str, name: str, path: str) -> None:
    module = parse_lora_module(spec)
    assert (module.name, module.path) == (name, path)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        pytest.param(
            ("--max-loras", "4", "--max-cpu-loras", "2"),
            2,
            "--max-cpu-loras=2 must be >= --max-loras=4",
            id="cpu-below-gpu",
        ),
        pytest.param(("--lora-modules", "no-equals-sign"), 2, "expected name=path", id="bad-module-spec"),
        pytest.param(("--time-scale", "-1"), 2, "--time-scale=-1.0 must be >= 0", id="negative-time-scale"),
        pytest.param(
            ("--profile", "a100-40gb-llama3-8b", "--enable-lora", "--max-loras", "32", "--max-lora-rank", "256"),
            2,
            "fewer than --max-model-len",
            id="lora-buffers-eat-the-kv-cache",
        ),
        pytest.param(("--max-lora-rank", "24"), 2, "invalid choice", id="rank-not-allowed"),
    ],
)
def test_refuses_to_start(argv: tuple[str, ...], code: int, message: str) -> None:
    result = run_cli(*argv)
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_static_adapter_vllm_would_refuse_stops_startup(adapters: Callable[..., Path]) -> None:
    path = adapters("cli-r64", rank=64)
    result = run_cli("--enable-lora", "--port", "0", "--lora-modules", f"big={path}")
    assert result.returncode == 1
    assert "LoRA rank 64 is greater than max_lora_rank 16." in result.stderr


def test_help_lists_vllm_and_timing_flags() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--max-cpu-loras", "--lora-modules", "--time-scale", "--gpu-load-base-s", "--disk-cold-extra-base-s"):
        assert flag in result.stdout


def test_sigterm_stops_cleanly(start_sim: StartSim) -> None:
    sim = start_sim("--time-scale", "0")
    assert sim.proc.stop() == 0
    assert "Stopped vLLM simulator" in sim.proc.output()
