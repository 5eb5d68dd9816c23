"""The derivation: adapters + model dims + GPU -> vLLM LoRA flags and a memory budget. Pure.

Called by `lorapool plan`, by the renderer's callers and by the operator. It never
does I/O: ranks read from adapter sources and a fetched ``config.json`` come in as
arguments. Every derived value carries a one-line reason a platform engineer can
check, and every refusal names the field and the fix.

Memory model, per GPU (vLLM allocates in this order, the KV cache gets the rest):
    usable   = gpu_memory_utilization x GPU memory
    weights  = parameters x dtype bytes / tensor-parallel size
    lora     = vLLM's LoRA buffers: every slot at max rank (see ``lora_buffer_bytes``)
    reserve  = CUDA context and graphs + peak activations of one scheduled batch (estimate)
    kv_cache = usable - weights - lora - reserve
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.models import AUTO, LoRAPoolSpec
from lorapool.api.peft import VLLM_RANKS, vllm_rank_for
from lorapool.errors import PlanError
from lorapool.plan.dims import ModelDims, lookup_model
from lorapool.plan.gpus import GIB, GPUS, GpuType
from lorapool.plan.quantity import parse_bytes

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_RANK = 16  # vLLM's default --max-lora-rank, assumed while an adapter's rank is unknown
NAIVE_RANK = 256  # the "just set it high" value people reach for; the plan shows its cost
CUDA_CONTEXT_BYTES = int(1.5 * GIB)  # CUDA context, cuBLAS workspaces and CUDA graphs, measured ~1-2 GiB
MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1's default chunked-prefill budget on A100-class GPUs
HOST_RUNTIME_BYTES = 8 * GIB  # Python, tokenizer, CUDA host buffers of a vLLM process
DEFAULT_HOST_BYTES_EXTRA = 32 * GIB  # default pod memory = weights + this


@dataclass(frozen=True)
class AdapterRank:
    """An adapter's rank as far as it is known, and the spec field it comes from."""

    name: str
    field: str  # e.g. "spec.adapters[3]" or "LoRAAdapter ml/sql-coder"
    rank: int | None  # None: unknown yet (source not read)


@dataclass(frozen=True)
class Memory:
    gpu_bytes: int
    usable_bytes: int
    weights_bytes: int
    lora_bytes: int
    reserve_bytes: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    naive_rank: int
    naive_lora_bytes: int
    naive_kv_cache_tokens: int


@dataclass(frozen=True)
class Plan:
    """vLLM flags for one pool, the memory they leave, and why each has its value."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    max_model_len: int
    tensor_parallel_size: int
    memory: Memory
    reasons: Mapping[str, str]
    model: str
    gpu: str
    warnings: tuple[str, ...] = field(default=())

    def to_status(self) -> dict[str, Any]:
        """camelCase dict: ``status.plan`` and ``lorapool plan -o json``."""
        m = self.memory
        return {
            "maxLoras": self.max_loras,
            "maxLoraRank": self.max_lora_rank,
            "maxCpuLoras": self.max_cpu_loras,
            "maxModelLen": self.max_model_len,
            "tensorParallelSize": self.tensor_parallel_size,
            "memory": {
                "gpuBytes": m.gpu_bytes,
                "usableBytes": m.usable_bytes,
                "weightsBytes": m.weights_bytes,
                "loraBytes": m.lora_bytes,
                "reserveBytes": m.reserve_bytes,
                "kvCacheBytes": m.kv_cache_bytes,
                "kvCacheTokens": m.kv_cache_tokens,
                "naiveRank": m.naive_rank,
                "naiveLoraBytes": m.naive_lora_bytes,
                "naiveKvCacheTokens": m.naive_kv_cache_tokens,
            },
            "reasons": {
                "maxLoras": self.reasons["maxLoras"],
                "maxLoraRank": self.reasons["maxLoraRank"],
                "maxCpuLoras": self.reasons["maxCpuLoras"],
            },
        }


def dtype_bytes(dtype: str) -> int:
    """Bytes per element; 'auto' is bf16/fp16 for every model lorapool knows."""
    return 4 if dtype == "float32" else 2


def lora_buffer_bytes(dims: ModelDims, *, max_loras: int, max_rank: int, dtype_size: int, tp: int) -> int:
    """vLLM's LoRA GPU buffers per GPU (fully_sharded_loras off), allocated before the KV cache.

    bytes = L * r * b * [ N * (7H + 2q + 2kv + 3I/t) + 2(V + H) ]
    where q = heads*head_dim/t and kv = max(1, kv_heads/t)*head_dim. Each slot holds
    A (in x r) and B (r x out) for q/k/v/o and gate/up/down at the max rank; the 2(V+H)
    term is the embedding / LM-head LoRA that Llama-style models get.
    """
    h, i, n = dims.hidden_size, dims.intermediate_size, dims.num_layers
    q = dims.num_attention_heads * dims.head_dim // tp
    kv = max(1, dims.num_key_value_heads // tp) * dims.head_dim
    per_rank = n * (7 * h + 2 * q + 2 * kv + 3 * i // tp)
    if dims.embedding_lora:
        per_rank += 2 * (dims.vocab_size + h)
    return max_loras * max_rank * dtype_size * per_rank


def adapter_host_bytes(dims: ModelDims, *, rank: int, dtype_size: int) -> int:
    """One adapter in vLLM's CPU LRU cache: its full (unsharded) A and B matrices at its rank."""
    h, i = dims.hidden_size, dims.intermediate_size
    q = dims.num_attention_heads * dims.head_dim
    kv = dims.num_key_value_heads * dims.head_dim
    return rank * dtype_size * dims.num_layers * (7 * h + 2 * q + 2 * kv + 3 * i)


def kv_bytes_per_token(dims: ModelDims, *, dtype_size: int, tp: int) -> int:
    """K and V of one token on one GPU across all layers."""
    kv = max(1, dims.num_key_value_heads // tp) * dims.head_dim
    return 2 * dims.num_layers * kv * dtype_size


def reserve_bytes(dims: ModelDims, *, dtype_size: int, tp: int, max_num_seqs: int) -> int:
    """Non-KV runtime memory per GPU: CUDA context/graphs + peak activations (an estimate).

    Activations of one chunked-prefill step: MAX_NUM_BATCHED_TOKENS tokens through the
    widest layer (gate+up of the MLP, 2I/t) plus residual copies (4H); float32 logits for
    every running sequence at sampling.
    """
    activations = MAX_NUM_BATCHED_TOKENS * (2 * dims.intermediate_size // tp + 4 * dims.hidden_size) * dtype_size
    logits = max_num_seqs * dims.vocab_size * 4
    return CUDA_CONTEXT_BYTES + activations + logits


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def resolve_dims(spec: LoRAPoolSpec, fetched: ModelDims | None = None) -> ModelDims:
    """Model dims: spec override > fetched config.json > built-in table; PlanError if none."""
    if (arch := spec.base_model.architecture) is not None:
        return ModelDims(
            key="spec.baseModel.architecture",
            hidden_size=arch.hidden_size,
            intermediate_size=arch.intermediate_size,
            num_layers=arch.num_layers,
            num_attention_heads=arch.num_attention_heads,
            num_key_value_heads=arch.num_key_value_heads,
            head_dim=arch.head_dim or arch.hidden_size // arch.num_attention_heads,
            vocab_size=arch.vocab_size,
            num_parameters=arch.num_parameters,
            max_position_embeddings=arch.max_position_embeddings,
            embedding_lora=arch.embedding_lora,
        )
    if fetched is not None:
        return fetched
    if (known := lookup_model(spec.base_model.name, spec.base_model.source)) is not None:
        return known
    raise PlanError(
        f"spec.baseModel.name={spec.base_model.name!r}: lorapool does not know this model's dimensions "
        "and could not read its config.json; set spec.baseModel.architecture "
        "(hiddenSize, intermediateSize, numLayers, numAttentionHeads, numKeyValueHeads, vocabSize, numParameters)"
    )


def plan_pool(
    spec: LoRAPoolSpec,
    adapters: Sequence[AdapterRank],
    *,
    dims: ModelDims | None = None,
) -> Plan:
    """Derive --max-loras, --max-lora-rank and --max-cpu-loras for a pool. Raises PlanError."""
    model = resolve_dims(spec, dims)
    gpu: GpuType = GPUS[spec.gpu.product]
    tp = spec.gpu.count
    b = dtype_bytes(spec.base_model.dtype.value)
    lb = dtype_bytes(spec.lora.dtype.value) if spec.lora.dtype.value != "auto" else b
    problems: list[str] = []
    warnings: list[str] = []

    max_model_len = spec.vllm.max_model_len or min(model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    if max_model_len > model.max_position_embeddings:
        problems.append(
            f"spec.vllm.maxModelLen={max_model_len} exceeds the model's context {model.max_position_embeddings}; "
            f"set it to <= {model.max_position_embeddings}"
        )

    # --- max-lora-rank -------------------------------------------------------------------------
    known = [a for a in adapters if a.rank is not None]
    unknown = [a.name for a in adapters if a.rank is None]
    for a in known:
        assert a.rank is not None
        if a.rank > VLLM_RANKS[-1]:
            problems.append(
                f"{a.field}.rank={a.rank} exceeds vLLM's largest rank {VLLM_RANKS[-1]}; "
                f"retrain at <= {VLLM_RANKS[-1]} or drop the adapter"
            )
    largest = max(
        (a for a in known if a.rank is not None and a.rank <= VLLM_RANKS[-1]), key=lambda a: a.rank or 0, default=None
    )
    if spec.lora.max_lora_rank == AUTO:
        if largest is None:
            rank = DEFAULT_RANK
            why = f"{DEFAULT_RANK} (vLLM's default): no adapter rank known yet"
        else:
            assert largest.rank is not None
            rank = vllm_rank_for(largest.rank)
            rounded = "" if rank == largest.rank else f", rounded up to vLLM's allowed rank {rank}"
            why = f"{rank}: largest adapter rank is {largest.rank} ({largest.name}){rounded}"
        if unknown:
            why += f"; rank unknown for {_names(unknown)}, assumed <= {rank}"
    else:
        rank = int(spec.lora.max_lora_rank)
        why = f"{rank}: set in spec.lora.maxLoraRank"
        too_big = [a for a in known if a.rank is not None and rank < a.rank <= VLLM_RANKS[-1]]
        for a in too_big:
            problems.append(
                f"spec.lora.maxLoraRank={rank} is below {a.field} ({a.name}) rank {a.rank}; vLLM would refuse "
                f"to load it: set maxLoraRank to {vllm_rank_for(a.rank or 1)} or 'auto'"
            )
        if largest is not None and largest.rank is not None and vllm_rank_for(largest.rank) < rank:
            why += f" (auto would be {vllm_rank_for(largest.rank)}: every slot pays for rank {rank})"
    reasons = {"maxLoraRank": why}

    # --- memory budget -------------------------------------------------------------------------
    usable = int(gpu.memory_bytes * spec.vllm.gpu_memory_utilization)
    weights = model.num_parameters * b // tp
    reserve = reserve_bytes(model, dtype_size=b, tp=tp, max_num_seqs=spec.vllm.max_num_seqs)
    per_token = kv_bytes_per_token(model, dtype_size=b, tp=tp)
    before_lora = usable - weights - reserve
    if before_lora <= 0:
        raise PlanError(
            [
                *problems,
                f"spec.gpu: {model.key} weights need {_gb(weights)} per GPU (+{_gb(reserve)} runtime) but "
                f"{spec.gpu.product} x{tp} at gpuMemoryUtilization {spec.vllm.gpu_memory_utilization} gives "
                f"{_gb(usable)} per GPU; set spec.gpu.count to {_next_tp(model, gpu, spec, b, reserve)} "
                "or use a larger GPU",
            ]
        )
    slot = lora_buffer_bytes(model, max_loras=1, max_rank=rank, dtype_size=lb, tp=tp)
    one_seq = max_model_len * per_token

    # --- max-loras -----------------------------------------------------------------------------
    n_adapters = len(adapters)
    if spec.lora.max_loras == AUTO:
        floor_bytes = max(
            spec.lora.min_kv_cache_sequences * one_seq,
            int(spec.lora.min_kv_cache_fraction * before_lora),
        )
        fit = (before_lora - floor_bytes) // slot if before_lora > floor_bytes else 0
        wanted = slot_headroom(n_adapters)
        cap = min(wanted, spec.vllm.max_num_seqs)
        max_loras = int(min(cap, fit))
        if max_loras < 1:
            problems.append(
                f"spec.lora: even one LoRA slot at rank {rank} ({_gb(slot)}) leaves the KV cache below its floor of "
                f"{_gb(floor_bytes)} (max({spec.lora.min_kv_cache_sequences} x {max_model_len}-token sequences, "
                f"{spec.lora.min_kv_cache_fraction:.0%} of {_gb(before_lora)})); lower spec.vllm.maxModelLen, "
                "lora.minKvCacheSequences or the adapters' rank, or use a larger GPU"
            )
            max_loras = 1
            why = "1: nothing fits (see errors)"
        elif max_loras == wanted:
            why = (
                f"{max_loras}: a GPU slot for each of the {n_adapters} adapter(s), rounded up to {wanted} "
                f"({_gb(slot * max_loras)} at rank {rank}) so adapters can be added without restarting pods"
            )
        elif max_loras == spec.vllm.max_num_seqs:
            why = f"{max_loras}: capped by vllm.maxNumSeqs (a batch never holds more distinct adapters)"
        else:
            why = (
                f"{max_loras} of {n_adapters} adapters: each slot at rank {rank} costs {_gb(slot)}; more would push "
                f"the KV cache below max({spec.lora.min_kv_cache_sequences} x {max_model_len}-token sequences, "
                f"{spec.lora.min_kv_cache_fraction:.0%} of {_gb(before_lora)}); the router groups requests to "
                "keep the rest in the CPU cache"
            )
    else:
        max_loras = int(spec.lora.max_loras)
        why = f"{max_loras}: set in spec.lora.maxLoras"
        if n_adapters and max_loras > n_adapters:
            warnings.append(f"spec.lora.maxLoras={max_loras} exceeds the {n_adapters} adapters; slots will sit empty")
    reasons["maxLoras"] = why

    lora = lora_buffer_bytes(model, max_loras=max_loras, max_rank=rank, dtype_size=lb, tp=tp)
    kv = before_lora - lora
    if kv < one_seq and not problems:
        problems.append(
            f"spec.lora: {max_loras} slots at rank {rank} take {_gb(lora)}, leaving {_gb(max(kv, 0))} of KV cache, "
            f"less than one {max_model_len}-token sequence ({_gb(one_seq)}); vLLM would fail to start: lower "
            "spec.lora.maxLoras or maxLoraRank, or spec.vllm.maxModelLen"
        )

    # --- max-cpu-loras -------------------------------------------------------------------------
    host_bytes = pod_memory_bytes(spec, weights * tp)
    # Sized by the rank bucket, not the adapter count: the cache fills on demand, so a large
    # capacity costs nothing until used, and adding adapters does not change the flag.
    per_adapter = adapter_host_bytes(model, rank=rank, dtype_size=lb)
    host_fit = max(0, (host_bytes - weights * tp - HOST_RUNTIME_BYTES) // per_adapter)
    if spec.lora.max_cpu_loras == AUTO:
        max_cpu = int(max(max_loras, host_fit))
        if max_cpu == max_loras and host_fit < max_loras:
            why = f"{max_cpu}: at least maxLoras (vLLM requires max-cpu-loras >= max-loras)"
        elif host_fit >= n_adapters:
            why = (
                f"{max_cpu}: pod memory {_gb(host_bytes)} minus weights and runtime caches {host_fit} adapters of "
                f"rank <= {rank} ({_gb(per_adapter)} each); all {n_adapters} fit, with room to add more without a restart"
            )
        else:
            why = (
                f"{max_cpu} of {n_adapters}: pod memory {_gb(host_bytes)} minus weights and runtime caches {host_fit} "
                f"adapters of {_gb(per_adapter)}; the rest load from disk on a miss (~40-500 ms): raise "
                "spec.vllm.resources.limits.memory to cache more"
            )
    else:
        max_cpu = int(spec.lora.max_cpu_loras)
        why = f"{max_cpu}: set in spec.lora.maxCpuLoras"
        if max_cpu < max_loras:
            problems.append(
                f"spec.lora.maxCpuLoras={max_cpu} is below maxLoras={max_loras}; vLLM refuses to start: "
                f"set maxCpuLoras >= {max_loras} or 'auto'"
            )
        if max_cpu > host_fit:
            warnings.append(
                f"spec.lora.maxCpuLoras={max_cpu} adapters of up to {_gb(per_adapter)} may not fit in pod memory "
                f"{_gb(host_bytes)}; raise spec.vllm.resources.limits.memory"
            )
    reasons["maxCpuLoras"] = why

    if problems:
        raise PlanError(problems)

    naive_lora = lora_buffer_bytes(model, max_loras=max_loras, max_rank=NAIVE_RANK, dtype_size=lb, tp=tp)
    naive_kv = before_lora - naive_lora
    memory = Memory(
        gpu_bytes=gpu.memory_bytes,
        usable_bytes=usable,
        weights_bytes=weights,
        lora_bytes=lora,
        reserve_bytes=reserve,
        kv_cache_bytes=kv,
        kv_cache_tokens=kv // per_token,
        naive_rank=NAIVE_RANK,
        naive_lora_bytes=naive_lora,
        naive_kv_cache_tokens=max(0, naive_kv) // per_token,
    )
    return Plan(
        max_loras=max_loras,
        max_lora_rank=rank,
        max_cpu_loras=max_cpu,
        max_model_len=max_model_len,
        tensor_parallel_size=tp,
        memory=memory,
        reasons=reasons,
        model=model.key,
        gpu=gpu.product,
        warnings=tuple(warnings),
    )


MIN_SLOTS = 8  # slots are cheap at low rank (Llama-3-8B r16: ~92 MB each); 8 spares most restarts


def slot_headroom(n_adapters: int) -> int:
    """GPU slots wanted for ``n_adapters``: the next power of two, at least MIN_SLOTS.

    vLLM's flags are fixed at start, so sizing exactly to the adapter count would roll
    every pod whenever an adapter is added; buckets keep adding adapters a ConfigMap update.
    """
    return max(MIN_SLOTS, 1 << max(0, n_adapters - 1).bit_length())


def pod_memory_bytes(spec: LoRAPoolSpec, weights_total: int) -> int:
    """The engine container's memory: spec.vllm.resources limits/requests, else weights + 32 GiB."""
    resources = spec.vllm.resources or {}
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get("memory")
        if value is not None:
            try:
                return parse_bytes(value, field=f"spec.vllm.resources.{section}.memory")
            except ValueError as exc:
                raise PlanError(str(exc) + "; use a quantity such as 96Gi") from exc
    return math.ceil((weights_total + DEFAULT_HOST_BYTES_EXTRA) / GIB) * GIB


def _next_tp(model: ModelDims, gpu: GpuType, spec: LoRAPoolSpec, b: int, reserve: int) -> str:
    for tp in (2, 4, 8):
        if (
            tp > spec.gpu.count
            and model.num_parameters * b // tp + reserve < gpu.memory_bytes * spec.vllm.gpu_memory_utilization * 0.8
        ):
            return str(tp)
    return "8"


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
