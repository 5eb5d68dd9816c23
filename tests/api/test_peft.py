from __future__ import annotations

import pytest

from lorapool.api.peft import parse_adapter_config, same_base_model, vllm_rank_for
from lorapool.errors import AdapterError


@pytest.mark.parametrize(("rank", "expected"), [(1, 1), (8, 8), (9, 16), (16, 16), (48, 64), (300, 320), (512, 512)])
def test_rank_rounds_up_to_a_vllm_rank(rank: int, expected: int) -> None:
    assert vllm_rank_for(rank) == expected


def test_rank_above_512_is_an_error() -> None:
    with pytest.raises(AdapterError, match="600 exceeds"):
        vllm_rank_for(600)


def test_rank_pattern_counts_towards_the_rank() -> None:
    config = parse_adapter_config({"r": 8, "rank_pattern": {"q_proj": 64}, "target_modules": ["q_proj"]})
    assert config.rank == 64 and config.servable


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"bias": "all"}, "bias"),
        ({"modules_to_save": ["classifier"]}, "modules_to_save"),
        ({"r": 1024}, "exceeds"),
    ],
)
def test_what_vllm_refuses_is_reported(extra: dict[str, object], problem: str) -> None:
    config = parse_adapter_config({"r": 8, **extra})
    assert not config.servable and problem in " ".join(config.problems)


@pytest.mark.parametrize("raw", [{"r": 0}, {"r": "8"}, {"peft_type": "IA3", "r": 8}, {"r": 8, "rank_pattern": [1]}])
def test_non_lora_configs_raise(raw: dict[str, object]) -> None:
    with pytest.raises(AdapterError):
        parse_adapter_config(raw)


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct", True),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "/models/meta-llama/meta-llama-3-8b-instruct/", True),
        ("meta-llama/Meta-Llama-3-8B-Instruct", None, True),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "mistralai/Mistral-7B-v0.1", False),
    ],
)
def test_base_model_comparison(expected: str, actual: str | None, same: bool) -> None:
    assert same_base_model(expected, actual) is same
