"""The timing model against the published figures it claims to reproduce (FIELD-NOTES.md)."""

from __future__ import annotations

import pytest

from lorapool.sim.timing import DEFAULT_PROFILE, PROFILES, TimingParams, kv_cache_tokens

T = TimingParams()


@pytest.mark.parametrize(
    ("num_seqs", "low_s", "high_s"),
    [
        pytest.param(0, 0.0, 0.0, id="empty-step-is-free"),
        pytest.param(1, 0.011, 0.011, id="batch-1-is-11ms-punica"),
        pytest.param(32, 0.013, 0.013, id="batch-32-is-13ms-punica"),
        pytest.param(16, 0.0115, 0.0125, id="batch-16-in-between"),
        pytest.param(256, 0.02, 0.035, id="batch-256-extrapolated"),
    ],
)
def test_decode_step_time_grows_with_batch(num_seqs: int, low_s: float, high_s: float) -> None:
    assert low_s <= T.decode_step_s(num_seqs) <= high_s + 1e-12


@pytest.mark.parametrize(
    ("distinct", "overhead"),
    [
        pytest.param(0, 0.0, id="base-model-only"),
        pytest.param(1, 0.10, id="one-adapter-punica-8-12pct"),
        pytest.param(8, 0.142, id="eight-adapters"),
        pytest.param(32, 0.28, id="many-adapters-capped-28pct"),
        pytest.param(500, 0.28, id="cap-holds"),
    ],
)
def test_lora_overhead(distinct: int, overhead: float) -> None:
    assert T.lora_overhead(distinct) == pytest.approx(overhead)


def test_forward_time_combines_batch_prefill_and_lora() -> None:
    plain = T.forward_s(4, prefill_tokens=0, distinct_adapters=0)
    assert T.forward_s(4, prefill_tokens=1000, distinct_adapters=0) == pytest.approx(
        plain + 1000 * T.prefill_s_per_token
    )
    assert T.forward_s(4, prefill_tokens=0, distinct_adapters=3) == pytest.approx(plain * (1 + T.lora_overhead(3)))
    assert T.forward_s(0, prefill_tokens=0, distinct_adapters=0) == 0.0


@pytest.mark.parametrize("rank", [8, 16, 32, 64])
def test_load_costs_fall_in_published_ranges(rank: int) -> None:
    # Agullo et al.: CPU->GPU 3-9 ms; disk->CPU 40-110 ms repeat, up to ~0.5 s first load.
    assert 0.0025 <= T.gpu_load_s(rank) <= 0.009
    warm = T.disk_load_s(rank, cold=False)
    cold = T.disk_load_s(rank, cold=True)
    assert 0.040 <= warm <= 0.110
    assert warm < cold <= 0.5


def test_load_cost_grows_with_rank() -> None:
    assert T.gpu_load_s(8) < T.gpu_load_s(64)
    assert T.disk_load_s(8, cold=False) < T.disk_load_s(64, cold=False)


def test_lora_buffers_come_out_of_the_kv_cache() -> None:
    profile = PROFILES[DEFAULT_PROFILE]

    def tokens(max_loras: int, rank: int, enable: bool = True) -> int:
        return kv_cache_tokens(
            profile, gpu_memory_utilization=0.9, enable_lora=enable, max_loras=max_loras, max_lora_rank=rank
        )

    # DESIGN.md: Llama-3-8B bf16, L=32, r=16 -> ~2.9 GB of LoRA buffers.
    lost_bytes = (tokens(1, 16, enable=False) - tokens(32, 16)) * profile.kv_bytes_per_token
    assert 2.8e9 <= lost_bytes <= 3.1e9
    assert tokens(32, 16) > tokens(32, 64) > tokens(32, 256)
    # An 80 GB A100 holds hundreds of thousands of Llama-3-8B tokens; a 40 GB one far fewer.
    assert 400_000 <= tokens(1, 16) <= 480_000
    small = kv_cache_tokens(
        PROFILES["a100-40gb-llama3-8b"], gpu_memory_utilization=0.9, enable_lora=True, max_loras=32, max_lora_rank=256
    )
    assert small == 0  # 47 GB of LoRA buffers cannot fit on a 40 GB card


def test_overrides_replace_single_fields() -> None:
    custom = T.with_overrides(decode_step_s_at_1=0.02)
    assert custom.decode_step_s_at_1 == 0.02
    assert custom.decode_step_s_at_32 == T.decode_step_s_at_32
