"""Timing and memory parameters of the simulated vLLM engine, each with its published source.

Pure: dataclasses and arithmetic, no I/O. ``engine.py`` reads a ``TimingParams`` to price every
engine step; ``cli.py`` turns every field into a ``--<name>`` override; the README table is
checked against the field metadata by a test, so the documentation cannot drift from the code.

Numbers come from /work/shared/FIELD-NOTES.md ("Numbers for the simulator") unless the source
says "derived" (arithmetic from model dimensions) or "fit" (a line through a published range;
the paper gives a range, not a per-rank curve, so the slope is ours).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3


def _param(default: float, doc: str, source: str) -> Any:
    return field(default=default, metadata={"doc": doc, "source": source})


@dataclass(frozen=True)
class TimingParams:
    """How long an engine step, an adapter load and a generation take. Units in the names."""

    decode_step_s_at_1: float = _param(
        0.011,
        "forward pass of a decode step with one sequence",
        "Punica (Chen et al., MLSys'24): ~11 ms decode step at batch 1, A100, 7-8B",
    )
    decode_step_s_at_32: float = _param(
        0.013,
        "forward pass of a decode step with 32 sequences; linear in between and beyond",
        "Punica: ~13 ms at batch 32, A100, 7-8B (beyond 32 is our linear extrapolation)",
    )
    prefill_s_per_token: float = _param(
        0.0001,
        "extra forward time per prompt token prefilled in a step",
        "derived: 2 x 8e9 FLOP/token / (312 TFLOP/s A100 bf16 x ~50 % MFU) ~= 0.1 ms",
    )
    lora_overhead_frac: float = _param(
        0.10,
        "forward-time overhead when the batch contains any adapter",
        "Punica: ~8-12 % with LoRA on, A100, r16",
    )
    lora_overhead_per_extra_adapter_frac: float = _param(
        0.006,
        "extra overhead per distinct adapter beyond the first in the batch",
        "fit: reaches the 28 % cap at ~31 extra adapters (Toppings/CaraServe, arXiv 2401.11240)",
    )
    lora_overhead_max_frac: float = _param(
        0.28,
        "cap on the total LoRA overhead with many distinct adapters",
        "Toppings/CaraServe (arXiv 2401.11240): up to ~28 % decode latency",
    )
    gpu_load_base_s: float = _param(
        0.002,
        "CPU->GPU slot load, fixed part (the whole batch stalls)",
        "fit to 3-9 ms for r8-r64 (Agullo et al., arXiv 2508.08343); Punica ~2 ms PCIe Gen4",
    )
    gpu_load_s_per_rank: float = _param(
        0.0001,
        "CPU->GPU slot load per unit of rank (bytes = 5.24 MB x rank for Llama-3-8B)",
        "fit to 3-9 ms for r8-r64 (Agullo et al., arXiv 2508.08343)",
    )
    disk_load_base_s: float = _param(
        0.035,
        "disk->CPU load of an adapter read before (warm page cache), fixed part",
        "fit to 40-110 ms repeat loads for r8-r64 (Agullo et al., arXiv 2508.08343)",
    )
    disk_load_s_per_rank: float = _param(
        0.0011,
        "disk->CPU load per unit of rank, warm page cache",
        "fit to 40-110 ms repeat loads for r8-r64 (Agullo et al., arXiv 2508.08343)",
    )
    disk_cold_extra_base_s: float = _param(
        0.2,
        "extra time for the first read of an adapter path in this process, fixed part",
        "fit to 'up to ~0.5 s first load' at r64 (Agullo et al., arXiv 2508.08343)",
    )
    disk_cold_extra_s_per_rank: float = _param(
        0.003,
        "extra first-read time per unit of rank",
        "fit to 'up to ~0.5 s first load' at r64 (Agullo et al., arXiv 2508.08343)",
    )
    natural_output_tokens_min: int = _param(
        8,
        "shortest output a request produces before its (simulated) EOS",
        "workloads in the literature: uniform [8, 512] output tokens (FIELD-NOTES)",
    )
    natural_output_tokens_max: int = _param(
        512,
        "longest output before EOS; max_tokens caps it, ignore_eos skips it",
        "workloads in the literature: uniform [8, 512] output tokens (FIELD-NOTES)",
    )

    def decode_step_s(self, num_seqs: int) -> float:
        """Forward time of a step that runs ``num_seqs`` sequences (no prefill, no LoRA)."""
        if num_seqs <= 0:
            return 0.0
        slope = (self.decode_step_s_at_32 - self.decode_step_s_at_1) / 31.0
        return self.decode_step_s_at_1 + slope * (num_seqs - 1)

    def lora_overhead(self, distinct_adapters: int) -> float:
        """Fractional slow-down of the forward pass with ``distinct_adapters`` in the batch."""
        if distinct_adapters <= 0:
            return 0.0
        extra = self.lora_overhead_per_extra_adapter_frac * (distinct_adapters - 1)
        return min(self.lora_overhead_frac + extra, self.lora_overhead_max_frac)

    def forward_s(self, num_seqs: int, prefill_tokens: int, distinct_adapters: int) -> float:
        """Forward time of one engine step, LoRA overhead included, load stalls excluded."""
        if num_seqs <= 0:
            return 0.0
        base = self.decode_step_s(num_seqs) + self.prefill_s_per_token * prefill_tokens
        return base * (1.0 + self.lora_overhead(distinct_adapters))

    def gpu_load_s(self, rank: int) -> float:
        """CPU cache -> GPU slot copy of one adapter."""
        return self.gpu_load_base_s + self.gpu_load_s_per_rank * rank

    def disk_load_s(self, rank: int, *, cold: bool) -> float:
        """Disk -> CPU cache read of one adapter; ``cold`` when this path was never read."""
        seconds = self.disk_load_base_s + self.disk_load_s_per_rank * rank
        if cold:
            seconds += self.disk_cold_extra_base_s + self.disk_cold_extra_s_per_rank * rank
        return seconds

    def with_overrides(self, **overrides: Any) -> TimingParams:
        return dataclasses.replace(self, **overrides)


@dataclass(frozen=True)
class Profile:
    """A GPU + base model pairing: memory facts and vLLM's defaults for that GPU."""

    name: str
    model: str
    gpu_memory_bytes: int
    weights_bytes: int
    kv_bytes_per_token: int
    lora_bytes_per_slot_rank: int
    activation_reserve_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    timing: TimingParams = TimingParams()


def _llama3_8b(name: str, gpu_memory_bytes: int) -> Profile:
    """Llama-3-8B (32 layers, hidden 4096, 8 KV heads x 128, intermediate 14336, vocab 128256, bf16)."""
    layers, hidden, kv_heads, head_dim, inter, vocab, dtype_bytes = 32, 4096, 8, 128, 14336, 128256, 2
    kv_dim = kv_heads * head_dim
    return Profile(
        name=name,
        model="meta-llama/Meta-Llama-3-8B-Instruct",
        gpu_memory_bytes=gpu_memory_bytes,
        # derived: 8.03e9 parameters x 2 bytes
        weights_bytes=16_060_000_000,
        # derived: K and V x layers x KV heads x head_dim x 2 bytes = 128 KiB
        kv_bytes_per_token=2 * layers * kv_dim * dtype_bytes,
        # derived (DESIGN.md section 1): b x [N(7H + 2q + 2kv + 3I) + 2(V + H)] per slot and rank
        lora_bytes_per_slot_rank=dtype_bytes
        * (layers * (7 * hidden + 2 * hidden + 2 * kv_dim + 3 * inter) + 2 * (vocab + hidden)),
        # estimate: vLLM's profiled activation peak plus CUDA graphs for an 8B model, ~1-2 GiB
        activation_reserve_bytes=2 * GIB,
        # config.json max_position_embeddings of Llama-3-8B
        max_model_len=8192,
        # vLLM EngineArgs.get_batch_defaults for the OpenAI server on an A100 (A100 stays on the
        # small defaults on purpose, vLLM PR #17885)
        max_num_seqs=256,
        max_num_batched_tokens=2048,
    )


PROFILES: dict[str, Profile] = {
    "a100-llama3-8b": _llama3_8b("a100-llama3-8b", 80 * GIB),
    "a100-40gb-llama3-8b": _llama3_8b("a100-40gb-llama3-8b", 40 * GIB),
}
DEFAULT_PROFILE = "a100-llama3-8b"


def kv_cache_tokens(
    profile: Profile,
    *,
    gpu_memory_utilization: float,
    enable_lora: bool,
    max_loras: int,
    max_lora_rank: int,
) -> int:
    """Tokens of KV cache left after weights, activations and LoRA buffers (may be <= 0).

    vLLM sizes the KV cache last, so every LoRA slot at max rank comes straight out of it.
    """
    budget = int(profile.gpu_memory_bytes * gpu_memory_utilization)
    budget -= profile.weights_bytes + profile.activation_reserve_bytes
    if enable_lora:
        budget -= max_loras * max_lora_rank * profile.lora_bytes_per_slot_rank
    return math.floor(budget / profile.kv_bytes_per_token) if budget > 0 else 0


def timing_fields() -> list[dataclasses.Field[Any]]:
    """The overridable timing parameters, in declaration order (for the CLI and the README)."""
    return list(dataclasses.fields(TimingParams))
