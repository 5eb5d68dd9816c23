"""The simulator refuses adapters that do not fit its model through the shared verifier (``sources.verify``),
with the 500 every worker refusal gets; vLLM itself loads most of them (tests/conformance records it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapool.sim.adapters import AdapterLoadError, read_adapter
from lorapool.sim.cli import base_shape_of
from lorapool.sources.verify import BaseShape
from lorapool_dev.engine.tinymodel import DEFAULT_SPEC, llama_config, write_tiny_adapter
from lorapool_dev.testing.peft import Misfit, write_misfit_adapter

TINY = BaseShape.from_config(llama_config(DEFAULT_SPEC), name="tiny-llama")

WORDS = {
    Misfit.OTHER_SHAPE: "tiny-llama expects [8, 512] (r x intermediate_size 512)",
    Misfit.OTHER_PREFIX: "vllm#34186",
    Misfit.TOO_MANY_LAYERS: "is for layer 2, but tiny-llama has 2 layers",
    Misfit.RANK_MISMATCH: "says r=8 for it",
    Misfit.MODULE_BASE_LACKS: "expected target modules in",  # vLLM's own refusal comes first
    Misfit.NO_LORA_TENSORS: "holds no LoRA tensors",
}


def _misfit(tmp_path: Path, kind: Misfit) -> Path:
    return write_misfit_adapter(tmp_path / kind.value, kind, module_shapes=DEFAULT_SPEC.module_shapes(), num_layers=2)


@pytest.mark.parametrize("kind", list(WORDS), ids=[k.value for k in WORDS])
def test_a_misfit_is_a_worker_failure(tmp_path: Path, kind: Misfit) -> None:
    with pytest.raises(AdapterLoadError) as caught:
        read_adapter("x", str(_misfit(tmp_path, kind)), max_lora_rank=16, base=TINY)
    assert (caught.value.status, caught.value.err_type) == (500, "InternalServerError")
    assert caught.value.message.startswith("Call to add_lora method failed: Worker failed with error '")
    assert WORDS[kind] in caught.value.message


def test_a_fitting_adapter_loads_and_without_a_shape_only_config_and_weights_are_checked(tmp_path: Path) -> None:
    good = write_tiny_adapter(tmp_path / "good", rank=8)
    assert read_adapter("g", str(good), max_lora_rank=16, base=TINY).config.rank == 8
    other = _misfit(tmp_path, Misfit.OTHER_SHAPE)
    assert read_adapter("o", str(other), max_lora_rank=16).config.rank == 8
    with pytest.raises(AdapterLoadError, match="vllm#34186"):
        read_adapter("p", str(_misfit(tmp_path, Misfit.OTHER_PREFIX)), max_lora_rank=16, base=TINY)
    # Without a shape, names are vLLM's to judge: it loads another prefix and serves base output.
    assert read_adapter("q", str(_misfit(tmp_path, Misfit.OTHER_PREFIX)), max_lora_rank=16).config.rank == 8


def test_the_sim_reads_its_shape_from_a_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(llama_config(DEFAULT_SPEC)))
    assert base_shape_of(str(tmp_path), name="tiny-llama") == TINY
    assert base_shape_of("meta-llama/Meta-Llama-3-8B-Instruct", name="x") is None  # a label: no shape
    assert base_shape_of(str(tmp_path / "nowhere"), name="x") is None
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 256}))
    with pytest.raises(
        ValueError, match=r"--model .*: cannot read the model's shape from config.json: .*'num_attention_heads'"
    ):
        base_shape_of(str(tmp_path), name="x")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the model's shape"):
        base_shape_of(str(tmp_path), name="x")
