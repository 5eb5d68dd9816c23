"""Reading real PEFT adapter directories: what vLLM accepts, and the status it refuses others with."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lorapool.sim.adapters import AdapterLoadError, read_adapter
from lorapool_dev.testing.peft import write_peft_adapter


def _truncate(path: Path) -> None:
    tensors = path / "adapter_model.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:-100])


def _garbage(path: Path) -> None:
    (path / "adapter_model.safetensors").write_bytes(b"\xff" * 64)


def _no_tensors(path: Path) -> None:
    (path / "adapter_model.safetensors").unlink()


def _bad_json(path: Path) -> None:
    (path / "adapter_config.json").write_text("{not json")


def _no_config(path: Path) -> None:
    (path / "adapter_config.json").unlink()


def test_a_servable_adapter_reports_its_rank(tmp_path: Path) -> None:
    path = write_peft_adapter(tmp_path / "ok", rank=8, extra_config={"rank_pattern": {"q_proj": 16}})
    files = read_adapter("ok", str(path), max_lora_rank=16)
    assert files.config.rank == 16  # rank_pattern counts
    assert files.tensor_bytes > 0


@pytest.mark.parametrize(
    ("rank", "extra", "damage", "status", "message"),
    [
        pytest.param(8, None, _no_config, 404, "No adapter found for", id="no-adapter-config-404"),
        # vLLM 0.32 (CPU) answers 500 for everything its worker refuses (tests/conformance measures it).
        pytest.param(32, None, None, 500, "LoRA rank 32 is greater than max_lora_rank 16.", id="rank-too-high-500"),
        pytest.param(8, {"rank_pattern": {"v_proj": 64}}, None, 500, "LoRA rank 64 is greater", id="rank-pattern-500"),
        pytest.param(8, {"use_dora": True}, None, 500, "vLLM does not yet support DoRA.", id="dora-500"),
        pytest.param(8, {"bias": "all"}, None, 500, "Adapter bias is not supported.", id="bias-500"),
        pytest.param(
            8,
            {"modules_to_save": ["embed_tokens"]},
            None,
            500,
            "Unsupported modules_to_save: ['embed_tokens']",
            id="modules-to-save-500",
        ),
        pytest.param(8, {"peft_type": "IA3"}, None, 500, "not LORA", id="not-lora-500"),
        pytest.param(8, None, _bad_json, 500, "Call to add_lora method failed", id="config-not-json-500"),
        pytest.param(8, None, _no_tensors, 500, "doesn't contain tensors", id="no-tensors-500"),
        pytest.param(8, None, _garbage, 500, "not a readable safetensors file", id="corrupt-safetensors-500"),
        pytest.param(8, None, _truncate, 500, "ends at byte", id="truncated-safetensors-500"),
    ],
)
def test_refusals_match_vllm(
    tmp_path: Path,
    rank: int,
    extra: dict[str, object] | None,
    damage: Callable[[Path], None] | None,
    status: int,
    message: str,
) -> None:
    path = write_peft_adapter(tmp_path / "x", rank=rank, extra_config=extra)
    if damage:
        damage(path)
    with pytest.raises(AdapterLoadError) as caught:
        read_adapter("x", str(path), max_lora_rank=16)
    assert caught.value.status == status
    assert caught.value.err_type == ("NotFoundError" if status == 404 else "InternalServerError")
    assert message in caught.value.message


def test_missing_directory_is_404_with_vllm_message(tmp_path: Path) -> None:
    with pytest.raises(AdapterLoadError) as caught:
        read_adapter("gone", str(tmp_path / "nowhere"), max_lora_rank=16)
    assert caught.value.status == 404
    assert caught.value.message == f"Loading lora gone failed: No adapter found for {tmp_path / 'nowhere'}"


def test_modules_the_base_model_lacks_are_refused(tmp_path: Path) -> None:
    path = write_peft_adapter(tmp_path / "x", target_modules=("q_proj", "c_attn"))
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["target_modules"] == ["q_proj", "c_attn"]
    with pytest.raises(AdapterLoadError, match=r"received \['c_attn'\]") as caught:
        read_adapter("x", str(path), max_lora_rank=16)
    assert caught.value.status == 500


@pytest.mark.parametrize("rank", [1, 8, 16, 64, 256])
def test_rank_at_or_below_the_limit_loads(tmp_path: Path, rank: int) -> None:
    path = write_peft_adapter(tmp_path / f"r{rank}", rank=rank, hidden_size=16, num_layers=1)
    assert read_adapter("r", str(path), max_lora_rank=256).config.rank == rank
