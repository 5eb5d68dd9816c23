"""Verification of real PEFT adapter files against the base model (``lorapool.sources.verify``).

One case per refusal, each with the words a user reads: the tensor and the shape the base expects.
The base is the tiny Llama the real-engine tests serve (its config.json, as written for vLLM).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.errors import AdapterError
from lorapool.plan.dims import KNOWN_MODELS, ModelDims
from lorapool.plan.planner import resolve_dims
from lorapool.render.sidecar import base_shape_env
from lorapool.sources.verify import BaseShape, verify_adapter_dir
from lorapool_dev.engine.tinymodel import DEFAULT_SPEC, OTHER_SPEC, llama_config, write_tiny_adapter
from lorapool_dev.testing.peft import (
    Misfit,
    base_module_shapes,
    safetensors_bytes,
    write_misfit_adapter,
    write_peft_adapter,
)

TINY = BaseShape.from_config(llama_config(DEFAULT_SPEC), name="tiny-llama")
SHAPES = DEFAULT_SPEC.module_shapes()
LAYER0 = "base_model.model.model.layers.0"


def misfit(tmp_path: Path, kind: Misfit) -> Path:
    return write_misfit_adapter(tmp_path / kind.value, kind, module_shapes=SHAPES, num_layers=DEFAULT_SPEC.num_layers)


def refusal(path: Path, base: BaseShape | None) -> str:
    with pytest.raises(AdapterError) as caught:
        verify_adapter_dir(path, base, where="adapter 'x'")
    assert str(caught.value).startswith("adapter 'x': "), caught.value
    return str(caught.value)


def test_an_adapter_made_for_the_base_passes_and_says_what_was_checked(tmp_path: Path) -> None:
    good = write_tiny_adapter(tmp_path / "good", rank=8)
    checked = verify_adapter_dir(good, TINY, where="good")
    assert checked.checked.startswith("weights against tiny-llama (hidden 256, 2 layers")
    assert (checked.tensors, checked.layers, checked.rank) == (2 * 2 * 7, 2, 8)
    assert checked.modules == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    unchecked = verify_adapter_dir(good, None, where="good")
    assert unchecked.checked == "config and weights only, no base shape"
    assert "config and weights only" in unchecked.describe()


# misfit -> words the refusal must hold (the tensor, and the shape or layout expected)
REFUSED: dict[Misfit, tuple[str, ...]] = {
    Misfit.OTHER_SHAPE: (
        f"tensor '{LAYER0}.mlp.down_proj.lora_A.weight' has shape [8, 256]; tiny-llama expects [8, 512] "
        "(r x intermediate_size 512)",
        f"tensor '{LAYER0}.mlp.down_proj.lora_B.weight' has shape [128, 8]; tiny-llama expects [256, 8] "
        "(hidden_size 256 x r)",
        "(28 problems in all)",
    ),
    Misfit.OTHER_PREFIX: (
        "tensor 'base_model.model.layers.0.mlp.down_proj.lora_A.weight' names module 'layers.0.mlp.down_proj', "
        "which is not in the base; vLLM would ignore it without a word and serve base-model output (vllm#34186)",
        "expected 'base_model.model.model.layers.<i>.mlp.down_proj.lora_A.weight'",
    ),
    Misfit.TOO_MANY_LAYERS: (
        "tensor 'base_model.model.model.layers.2.mlp.down_proj.lora_A.weight' is for layer 2, "
        "but tiny-llama has 2 layers (0..1)",
    ),
    Misfit.RANK_MISMATCH: (
        f"tensor '{LAYER0}.mlp.down_proj.lora_A.weight' has rank 16 (shape [16, 512]), but adapter_config.json "
        "says r=8 for it (r, rank_pattern): expected [8, 512]",
    ),
    Misfit.MODULE_BASE_LACKS: (f"tensor '{LAYER0}.mlp.c_attn.lora_A.weight': the base has no module 'c_attn'",),
    Misfit.NO_LORA_TENSORS: ("holds no LoRA tensors",),
}


@pytest.mark.parametrize("kind", list(REFUSED), ids=[k.value for k in REFUSED])
def test_each_misfit_is_refused_naming_the_tensor_and_the_expected_shape(tmp_path: Path, kind: Misfit) -> None:
    message = refusal(misfit(tmp_path, kind), TINY)
    for words in REFUSED[kind]:
        assert words in message, message
    assert "adapter_config.json names base model 'tiny-llama'" in message


@pytest.mark.parametrize(
    ("kind", "refused"),
    [
        (Misfit.OTHER_SHAPE, False),  # shapes need the base
        (Misfit.TOO_MANY_LAYERS, False),  # so do layer counts
        (Misfit.OTHER_PREFIX, False),  # and module names: a base of another layout names them otherwise
        (Misfit.RANK_MISMATCH, True),
        (Misfit.MODULE_BASE_LACKS, False),  # vLLM refuses it at load, naming the modules it expected
        (Misfit.NO_LORA_TENSORS, True),
    ],
    ids=lambda v: v.value if isinstance(v, Misfit) else str(v),
)
def test_without_a_base_shape_config_and_weights_are_still_checked(tmp_path: Path, kind: Misfit, refused: bool) -> None:
    path = misfit(tmp_path, kind)
    if refused:
        assert REFUSED[kind][0].split(";")[0] in refusal(path, None)
    else:
        assert verify_adapter_dir(path, None, where="x").checked == "config and weights only, no base shape"


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("q_proj", "expects [8, 256] (r x hidden_size 256)"),
        ("k_proj", "expects [128, 8] (num_key_value_heads x head_dim 128 x r)"),
        ("v_proj", "expects [128, 8] (num_key_value_heads x head_dim 128 x r)"),
        ("o_proj", "expects [8, 256] (r x num_attention_heads x head_dim 256)"),
        ("gate_proj", "expects [8, 256] (r x hidden_size 256)"),
        ("up_proj", "expects [512, 8] (intermediate_size 512 x r)"),
        ("down_proj", "expects [8, 512] (r x intermediate_size 512)"),
    ],
)
def test_each_module_is_held_to_its_own_dimensions(tmp_path: Path, module: str, expected: str) -> None:
    """OTHER_SPEC has half the hidden size, heads and intermediate size, one kv head: every module misfits."""
    path = write_peft_adapter(
        tmp_path / module, rank=8, target_modules=(module,), module_shapes=OTHER_SPEC.module_shapes()
    )
    assert expected in refusal(path, TINY)


def test_rank_pattern_ranks_are_honoured_and_checked(tmp_path: Path) -> None:
    patterned = write_peft_adapter(
        tmp_path / "p", rank=8, module_shapes=SHAPES, extra_config={"rank_pattern": {"q_proj": 16}}
    )
    assert verify_adapter_dir(patterned, TINY, where="p").rank == 16
    flat = write_peft_adapter(
        tmp_path / "f", rank=8, module_shapes=SHAPES, weights_rank=8, extra_config={"rank_pattern": {"q_proj": 16}}
    )
    assert (
        f"tensor '{LAYER0}.self_attn.q_proj.lora_A.weight' has rank 8 (shape [8, 256]), but adapter_config.json "
        "says r=16" in refusal(flat, TINY)
    )


def _write_tensors(path: Path, tensors: dict[str, tuple[list[int], bytes]], dtype: str = "F16") -> Path:
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}))
    (path / "adapter_model.safetensors").write_bytes(safetensors_bytes(dict(tensors), dtype=dtype))
    return path


def _ab(module: str, a: list[int], b: list[int]) -> dict[str, tuple[list[int], bytes]]:
    size = 2 if len(a) < 3 else 1
    return {
        f"{module}.lora_A.weight": (a, b"\0" * (size * a[0] * a[-1])),
        f"{module}.lora_B.weight": (b, b"\0" * (size * b[0] * b[-1])),
    }


@pytest.mark.parametrize(
    ("tensors", "dtype", "words"),
    [
        pytest.param(
            {f"{LAYER0}.self_attn.q_proj.lora_A.weight": ([8, 256], b"\0" * 4096)},
            "F16",
            f"tensor '{LAYER0}.self_attn.q_proj.lora_A.weight' has no lora_B beside it",
            id="lora-A-without-B",
        ),
        pytest.param(
            {f"{LAYER0}.self_attn.q_proj.weight": ([256, 256], b"\0" * 2)},
            "F16",
            "is not a LoRA weight (vLLM refuses it: 'is unsupported LoRA weight')",
            id="not-a-lora-name",
        ),
        pytest.param(
            _ab(f"{LAYER0}.self_attn.q_proj", [8, 256], [256, 8]),
            "I8",
            "has dtype I8; LoRA weights are floating point",
            id="integer-dtype",
        ),
        pytest.param(
            {
                f"{LAYER0}.self_attn.q_proj.lora_A.weight": ([8, 256, 1], b"\0" * 2),
                f"{LAYER0}.self_attn.q_proj.lora_B.weight": ([256, 8], b"\0" * 2),
            },
            "F16",
            "has shape [8, 256, 1]; a LoRA weight is a matrix",
            id="three-dimensions",
        ),
        pytest.param(
            _ab(f"{LAYER0}.mlp.q_proj", [8, 256], [256, 8]),
            "F16",
            "names module 'model.layers.0.mlp.q_proj', which is not in the base",
            id="attention-module-under-mlp",
        ),
        pytest.param(
            {
                "base_model.model.model.embed_tokens.lora_embedding_A": ([8, 1000], b"\0" * 2),
                "base_model.model.model.embed_tokens.lora_embedding_B": ([256, 8], b"\0" * 2),
            },
            "F16",
            "expects [8, 320] (r x vocab_size 320)",
            id="embedding-for-another-vocabulary",
        ),
        pytest.param(
            _ab("base_model.model.lm_head", [8, 256], [1000, 8]),
            "F16",
            "expects [320, 8] (vocab_size 320 x r)",
            id="lm-head-for-another-vocabulary",
        ),
    ],
)
def test_hand_made_tensors_are_refused(
    tmp_path: Path, tensors: dict[str, tuple[list[int], bytes]], dtype: str, words: str
) -> None:
    assert words in refusal(_write_tensors(tmp_path / "x", tensors, dtype), TINY)


def test_saved_base_layers_are_skipped_as_vllm_skips_them(tmp_path: Path) -> None:
    tensors = {
        **_ab("base_model.model.lm_head", [8, 256], [320, 8]),
        "base_model.model.lm_head.base_layer.weight": ([320, 256], b"\0" * 2),
    }
    assert verify_adapter_dir(_write_tensors(tmp_path / "x", tensors), TINY, where="x").modules == ("lm_head",)


def test_bad_files_are_refused_before_their_tensors_are_read(tmp_path: Path) -> None:
    good = write_tiny_adapter(tmp_path / "t", rank=8)
    weights = good / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "the file is truncated or corrupt" in refusal(good, TINY)
    linked = write_tiny_adapter(tmp_path / "l", rank=8)
    (linked / "adapter_model.safetensors").unlink()
    (linked / "adapter_model.safetensors").symlink_to(weights)
    assert "adapter_model.safetensors is a symbolic link" in refusal(linked, TINY)
    no_weights = write_tiny_adapter(tmp_path / "n", rank=8)
    (no_weights / "adapter_model.safetensors").unlink()
    assert "no adapter_model.safetensors" in refusal(no_weights, TINY)
    (no_weights / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 0}')
    assert "'r' must be a positive integer" in refusal(no_weights, TINY)


def test_pickled_weights_are_not_read_and_the_verification_says_so(tmp_path: Path) -> None:
    path = write_tiny_adapter(tmp_path / "b", rank=8)
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    checked = verify_adapter_dir(path, TINY, where="b")
    assert checked.checked.startswith("config only: adapter_model.bin is not read")


# -- BaseShape: from config.json, from the planner's dims, through JSON -------------------------------


def test_base_shape_round_trips_through_json_and_matches_the_planners_dims() -> None:
    assert BaseShape.from_json(TINY.to_json()) == TINY
    assert TINY.to_json() == BaseShape.from_json(TINY.to_json().encode()).to_json()
    dims: ModelDims = KNOWN_MODELS["llama-3-8b"]
    shape = BaseShape.from_dims(dims)
    assert (shape.hidden_size, shape.num_layers, shape.num_key_value_heads, shape.head_dim) == (4096, 32, 8, 128)
    assert shape.name == "llama-3-8b" and BaseShape.from_json(shape.to_json()) == shape
    assert BaseShape.from_dims(_tiny_dims()) == TINY


def _tiny_dims() -> ModelDims:
    from lorapool.plan.dims import dims_from_config

    return dims_from_config(llama_config(DEFAULT_SPEC), key="tiny-llama")


def test_base_shape_from_config_defaults_and_nesting() -> None:
    config = {k: v for k, v in llama_config(DEFAULT_SPEC).items() if k not in ("head_dim", "num_key_value_heads")}
    shape = BaseShape.from_config(config, name="t")
    assert (shape.head_dim, shape.num_key_value_heads) == (64, 4)  # hidden / heads; kv heads = heads
    assert BaseShape.from_config({"text_config": llama_config(DEFAULT_SPEC)}, name="tiny-llama") == TINY
    nulls = {**llama_config(DEFAULT_SPEC), "head_dim": None, "num_key_value_heads": None}
    assert (BaseShape.from_config(nulls).head_dim, BaseShape.from_config(nulls).num_key_value_heads) == (64, 4)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"hidden_size": 256}, "config.json has no 'num_attention_heads'"),
        ({**llama_config(DEFAULT_SPEC), "num_hidden_layers": None}, "has no 'num_hidden_layers'"),
        ({**llama_config(DEFAULT_SPEC), "vocab_size": "320"}, "vocab_size='320' must be a positive integer"),
        ({**llama_config(DEFAULT_SPEC), "intermediate_size": 0}, "intermediate_size=0 must be a positive integer"),
    ],
)
def test_base_shape_from_a_bad_config_names_the_key(config: dict[str, object], words: str) -> None:
    with pytest.raises(AdapterError, match=r"^m: ") as caught:
        BaseShape.from_config(config, name="m")
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "base shape is not valid JSON"),
        ("[1]", "base shape must be a JSON object"),
        ('{"hidden_size": 1, "layers": 2}', "unknown keys ['layers']"),
        ('{"hidden_size": 256}', "base shape head_dim=None must be a positive integer"),
        (TINY.to_json().replace('"num_layers":2', '"num_layers":0'), "num_layers=0 must be a positive integer"),
    ],
)
def test_base_shape_from_bad_json_says_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(AdapterError) as caught:
        BaseShape.from_json(text)
    assert words in str(caught.value)


def test_the_operator_renders_the_planners_dims_for_the_sidecar(example_doc: dict[str, Any]) -> None:
    """The sidecar verifies against the dims the planner uses; a base without known dims renders none."""
    pool = parse_object(example_doc)
    assert isinstance(pool, LoRAPool)
    (env,) = base_shape_env(pool)
    assert env["name"] == "LORAPOOL_BASE_SHAPE"
    shape = BaseShape.from_json(env["value"])
    assert shape == replace(BaseShape.from_dims(resolve_dims(pool.spec)), name=pool.spec.base_model.name)
    example_doc["spec"]["baseModel"] = {"name": "acme/unknown-13b", "source": "hf://acme/unknown-13b"}
    unknown = parse_object(example_doc)
    assert isinstance(unknown, LoRAPool)
    assert base_shape_env(unknown) == []  # config and weights only
    # The template depends on the base model only: adapters never change it.
    example_doc["spec"]["baseModel"]["architecture"] = {
        "hiddenSize": 256,
        "intermediateSize": 512,
        "numLayers": 2,
        "numAttentionHeads": 4,
        "numKeyValueHeads": 2,
        "headDim": 64,
        "vocabSize": 320,
        "numParameters": 1_500_000,
    }
    tiny = parse_object(example_doc)
    assert isinstance(tiny, LoRAPool)
    # Dims from the spec say nothing of module names: shapes are judged, names are not.
    rendered = BaseShape.from_json(base_shape_env(tiny)[0]["value"])
    assert rendered == replace(TINY, name="acme/unknown-13b", llama_layout=False)


@pytest.mark.parametrize(
    ("kind", "refused"),
    [(Misfit.OTHER_PREFIX, False), (Misfit.MODULE_BASE_LACKS, False), (Misfit.OTHER_SHAPE, True)],
    ids=lambda v: v.value if isinstance(v, Misfit) else str(v),
)
def test_a_base_of_unknown_layout_judges_shapes_not_module_names(tmp_path: Path, kind: Misfit, refused: bool) -> None:
    """A base whose config.json is not a Llama-style model type (fused qkv_proj, ...) names its modules
    otherwise: its adapters are not refused for their names; tensors named as Llama's still fit or not."""
    other_layout = replace(TINY, llama_layout=False)
    path = misfit(tmp_path, kind)
    if refused:
        assert REFUSED[kind][0].split(";")[0] in refusal(path, other_layout)
    else:
        assert verify_adapter_dir(path, other_layout, where="x").checked.startswith("weights against")
    phi = {**llama_config(DEFAULT_SPEC), "model_type": "phi3"}
    assert BaseShape.from_config(phi, name="phi").llama_layout is False
    assert TINY.llama_layout is True and BaseShape.from_json(TINY.to_json()) == TINY


def test_an_adapter_written_for_a_known_base_fits_the_shape_rendered_for_it(
    example_doc: dict[str, Any], tmp_path: Path
) -> None:
    """Tests that serve a pool of a known base through real sidecars write adapters of its shape."""
    pool = parse_object(example_doc)
    assert isinstance(pool, LoRAPool)
    shape = BaseShape.from_json(base_shape_env(pool)[0]["value"])
    name = pool.spec.base_model.name
    fits = write_peft_adapter(tmp_path / "fits", rank=8, base_model=name, module_shapes=base_module_shapes(name))
    assert verify_adapter_dir(fits, shape, where="fits").checked.startswith(f"weights against {name}")
    small = write_peft_adapter(tmp_path / "small", rank=8, base_model=name)  # 64 wide: for header-only tests
    assert f"{name} expects [8, 4096] (r x hidden_size 4096)" in refusal(small, shape)
    assert base_module_shapes("acme/unknown-13b") is None
