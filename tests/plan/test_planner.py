from __future__ import annotations

from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.errors import PlanError
from lorapool.plan.dims import KNOWN_MODELS, dims_from_config, lookup_model
from lorapool.plan.planner import AdapterRank, lora_buffer_bytes, plan_pool

LLAMA8B = KNOWN_MODELS["llama-3-8b"]


def pool(**spec: Any) -> LoRAPool:
    base = {
        "baseModel": {
            "name": "meta-llama/Meta-Llama-3-8B-Instruct",
            "source": "hf://meta-llama/Meta-Llama-3-8B-Instruct",
        },
        "gpu": {"product": "A100-80GB"},
    }
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": base | spec,
        }
    )
    assert isinstance(obj, LoRAPool)
    return obj


def ranks(*values: int | None) -> list[AdapterRank]:
    return [AdapterRank(f"a{i}", f"spec.adapters[{i}]", r) for i, r in enumerate(values)]


@pytest.mark.parametrize(
    ("max_loras", "rank", "expected_gb"),
    [(32, 16, 2.9), (32, 64, 11.8), (32, 256, 47.0)],
    ids=["L32-r16", "L32-r64", "L32-r256"],
)
def test_llama3_8b_lora_buffers_match_design(max_loras: int, rank: int, expected_gb: float) -> None:
    got = lora_buffer_bytes(LLAMA8B, max_loras=max_loras, max_rank=rank, dtype_size=2, tp=1) / 1e9
    assert got == pytest.approx(expected_gb, rel=0.03)


@pytest.mark.parametrize(
    ("adapter_rank", "expected"), [(8, 8), (9, 16), (48, 64), (300, 320)], ids=["8->8", "9->16", "48->64", "300->320"]
)
def test_auto_rank_rounds_up(adapter_rank: int, expected: int) -> None:
    plan = plan_pool(pool().spec, ranks(4, adapter_rank))
    assert plan.max_lora_rank == expected
    assert str(adapter_rank) in plan.reasons["maxLoraRank"]


def test_rank_600_is_an_error_naming_the_adapter() -> None:
    with pytest.raises(PlanError, match=r"spec.adapters\[1\].rank=600 exceeds"):
        plan_pool(pool().spec, ranks(8, 600))


def test_unknown_ranks_assume_the_vllm_default_and_say_so() -> None:
    plan = plan_pool(pool().spec, ranks(None, None))
    assert plan.max_lora_rank == 16 and "unknown" in plan.reasons["maxLoraRank"]


@pytest.mark.parametrize(("n", "slots"), [(0, 8), (2, 8), (8, 8), (9, 16), (33, 64)])
def test_cheap_slots_are_bucketed_so_adding_adapters_rarely_restarts(n: int, slots: int) -> None:
    assert plan_pool(pool().spec, ranks(*[8] * n)).max_loras == slots


@pytest.mark.parametrize(
    ("gpu", "adapter_ranks", "lora", "max_slots", "min_slots"),
    [
        ("A100-80GB", [300], {}, 2, 1),  # the rank-300 pool: 2 slots (1.85 GB each), not 8 at 14.8 GB
        ("A100-80GB", [320], {}, 2, 1),
        ("A100-80GB", [16] * 32, {}, 32, 32),  # a slot per adapter is cheap here: all 32
        ("A100-80GB", [16] * 2, {}, 8, 8),  # cheap spares: rounded up to 8
        ("A100-80GB", [16] * 2, {"headroomKvCacheFraction": 0}, 2, 2),  # tuned off: exactly one each
        ("A100-40GB", [256], {}, 1, 1),  # a spare would cost > 5% of a small KV cache
        ("A100-80GB", [64] * 5, {"headroomKvCacheFraction": 0.5}, 8, 8),
    ],
    ids=["r300-80GB", "r320-80GB", "32xr16-80GB", "2xr16", "headroom-off", "r256-40GB", "headroom-tuned-up"],
)
def test_spare_slots_only_while_cheap(
    gpu: str, adapter_ranks: list[int], lora: dict[str, Any], max_slots: int, min_slots: int
) -> None:
    plan = plan_pool(pool(gpu={"product": gpu}, lora=lora).spec, ranks(*adapter_ranks))
    assert min_slots <= plan.max_loras <= max_slots, plan.reasons["maxLoras"]
    n = len(adapter_ranks)
    slot = lora_buffer_bytes(LLAMA8B, max_loras=1, max_rank=plan.max_lora_rank, dtype_size=2, tp=1)
    before_lora = plan.memory.usable_bytes - plan.memory.weights_bytes - plan.memory.reserve_bytes
    fraction = lora.get("headroomKvCacheFraction", 0.05)
    assert (plan.max_loras - n) * slot <= fraction * (before_lora - n * slot)  # the rule itself


def test_the_headroom_reason_states_its_price() -> None:
    reason = plan_pool(pool().spec, ranks(300)).reasons["maxLoras"]
    assert "1 spare" in reason and "1.8 GB" in reason and "% of the KV cache" in reason, reason
    assert "headroomKvCacheFraction" in reason
    none = plan_pool(pool(gpu={"product": "A100-40GB"}).spec, ranks(256)).reasons["maxLoras"]
    assert "no spare" in none and "above the 5% limit" in none, none


def test_adding_adapters_keeps_a_headroom_choice() -> None:
    """Spares shrink as adapters are added, so the chosen value never grows until they are used up."""
    values = [plan_pool(pool().spec, ranks(*[64] * n)).max_loras for n in range(1, 9)]
    assert values == sorted(values) and len(set(values)) <= 3, values


def test_adding_an_adapter_within_a_bucket_keeps_every_flag() -> None:
    before, after = plan_pool(pool().spec, ranks(16, 8)), plan_pool(pool().spec, ranks(16, 8, 16))
    assert (before.max_loras, before.max_lora_rank, before.max_cpu_loras, before.memory) == (
        after.max_loras,
        after.max_lora_rank,
        after.max_cpu_loras,
        after.memory,
    )


def test_small_pool_gets_headroom_and_cpu_cache_for_all() -> None:
    plan = plan_pool(pool().spec, ranks(16, 8))
    assert (plan.max_loras, plan.max_lora_rank) == (8, 16)
    assert plan.max_cpu_loras >= 8 and "all 2 fit" in plan.reasons["maxCpuLoras"]
    m = plan.memory
    assert m.usable_bytes == m.weights_bytes + m.lora_bytes + m.reserve_bytes + m.kv_cache_bytes
    assert m.kv_cache_tokens == m.kv_cache_bytes // (2 * 32 * 8 * 128 * 2)
    assert m.naive_kv_cache_tokens < m.kv_cache_tokens


def test_many_adapters_are_bounded_by_the_kv_floor() -> None:
    spec = pool(lora={"minKvCacheFraction": 0.9}).spec
    plan = plan_pool(spec, ranks(*[64] * 200))
    assert 1 <= plan.max_loras < 200
    assert "more would push the KV cache" in plan.reasons["maxLoras"]
    before_lora = plan.memory.usable_bytes - plan.memory.weights_bytes - plan.memory.reserve_bytes
    assert plan.memory.kv_cache_bytes >= 0.9 * before_lora


def test_many_adapters_are_capped_by_max_num_seqs_and_cpu_memory() -> None:
    plan = plan_pool(pool(vllm={"maxNumSeqs": 64}).spec, ranks(*[8] * 2000))
    assert plan.max_loras == 64
    assert 64 <= plan.max_cpu_loras < 2000 and "pod memory" in plan.reasons["maxCpuLoras"]


def test_explicit_values_win_but_are_checked() -> None:
    plan = plan_pool(pool(lora={"maxLoras": 4, "maxLoraRank": 64, "maxCpuLoras": 10}).spec, ranks(8))
    assert (plan.max_loras, plan.max_lora_rank, plan.max_cpu_loras) == (4, 64, 10)
    assert "auto would be 8" in plan.reasons["maxLoraRank"]
    with pytest.raises(PlanError, match=r"maxLoraRank=16 is below spec.adapters\[0\] \(a0\) rank 64"):
        plan_pool(pool(lora={"maxLoraRank": 16}).spec, ranks(64))


def test_explicit_slots_that_leave_no_kv_cache_are_refused() -> None:
    with pytest.raises(PlanError, match="less than one 8192-token sequence"):
        plan_pool(pool(gpu={"product": "A100-40GB"}, lora={"maxLoras": 64, "maxLoraRank": 256}).spec, ranks(8))


def test_weights_that_do_not_fit_say_what_to_change() -> None:
    spec = pool(
        baseModel={
            "name": "meta-llama/Meta-Llama-3-70B-Instruct",
            "source": "hf://meta-llama/Meta-Llama-3-70B-Instruct",
        }
    ).spec
    with pytest.raises(PlanError, match=r"set spec\.gpu\.count to 4"):
        plan_pool(spec, ranks(8))
    tp = pool(
        baseModel={"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": "hf://x/y"},
        gpu={"product": "A100-80GB", "count": 4},
    ).spec
    assert plan_pool(tp, ranks(8)).tensor_parallel_size == 4


def test_rank_too_big_for_a_small_gpu_is_not_ready() -> None:
    spec = pool(
        gpu={"product": "A100-40GB"},
        vllm={"maxModelLen": 8192},
        lora={"minKvCacheSequences": 4, "minKvCacheFraction": 0.95},
    ).spec
    with pytest.raises(PlanError, match="even one LoRA slot"):
        plan_pool(spec, ranks(512))


def test_unknown_model_needs_architecture() -> None:
    spec = pool(baseModel={"name": "acme/secret-model", "source": "s3://models/secret"}).spec
    with pytest.raises(PlanError, match=r"spec\.baseModel\.architecture"):
        plan_pool(spec, ranks(8))
    arch = {
        "hiddenSize": 4096,
        "intermediateSize": 14336,
        "numLayers": 32,
        "numAttentionHeads": 32,
        "numKeyValueHeads": 8,
        "vocabSize": 128256,
        "numParameters": 8_030_000_000,
    }
    spec = pool(baseModel={"name": "acme/secret-model", "source": "s3://models/secret", "architecture": arch}).spec
    assert plan_pool(spec, ranks(8)).model == "spec.baseModel.architecture"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
    ],
)
def test_model_table_lookup(name: str, key: str) -> None:
    found = lookup_model(name)
    assert found is not None and found.key == key


def test_dims_from_config_estimates_parameters() -> None:
    config = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    }
    dims = dims_from_config(config)
    assert dims.num_parameters == pytest.approx(LLAMA8B.num_parameters, rel=0.02)
    with pytest.raises(ValueError, match="architecture"):
        dims_from_config({"hidden_size": 1})


def test_plan_status_uses_the_documented_names() -> None:
    status = plan_pool(pool().spec, ranks(8)).to_status().to_wire()
    assert set(status) >= {"maxLoras", "maxLoraRank", "maxCpuLoras", "memory", "reasons"}
    assert set(status["memory"]) >= {"weightsBytes", "loraBytes", "reserveBytes", "kvCacheBytes", "kvCacheTokens"}
    assert set(status["reasons"]) == {"maxLoras", "maxLoraRank", "maxCpuLoras"}


@pytest.mark.parametrize(
    ("model", "count", "refused"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 8, True),  # 28 heads
        ("Qwen/Qwen2.5-7B-Instruct", 4, False),
        ("meta-llama/Meta-Llama-3-8B-Instruct", 8, False),  # 32 heads, 8 KV heads
    ],
)
def test_gpu_count_must_split_the_attention_heads(model: str, count: int, refused: bool) -> None:
    spec = pool(baseModel={"name": model, "source": f"hf://{model}"}, gpu={"product": "A100-80GB", "count": count}).spec
    if not refused:
        assert plan_pool(spec, ranks(8)).tensor_parallel_size == count
        return
    with pytest.raises(PlanError, match=r"spec\.gpu\.count=8 does not divide .* set spec\.gpu\.count to 1, 2 or 4"):
        plan_pool(spec, ranks(8))


def test_a_bad_memory_quantity_is_reported_beside_other_problems() -> None:
    spec = pool(vllm={"resources": {"limits": {"memory": "lots"}}, "maxModelLen": 100000}).spec
    with pytest.raises(PlanError) as info:
        plan_pool(spec, ranks(8))
    assert len(info.value.problems) == 2, info.value.problems
