"""The vLLM flags other than --max-loras, one function each returning value, reason and problems:
--tensor-parallel-size (checked), --max-model-len, --max-lora-rank and --max-cpu-loras. Pure.

Called by ``plan.planner.plan_pool``, which collects their problems in flag order into one
PlanError; ``Derived`` is also what ``plan.slots`` (--max-loras) returns. Every reason is one
line a platform engineer can check; every problem names the field and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lorapool.api.models import AUTO, LoRAPoolSpec, LoraSpec
from lorapool.api.peft import VLLM_RANKS, vllm_rank_for
from lorapool.plan.dims import ModelDims
from lorapool.plan.memory import HOST_RUNTIME_BYTES, Budget, adapter_host_bytes, gb, pod_memory_bytes
from lorapool.plan.sizing import Concurrency

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_RANK = 16  # vLLM's default --max-lora-rank, assumed while an adapter's rank is unknown


@dataclass(frozen=True)
class AdapterRank:
    """An adapter's rank as far as it is known, and the spec field it comes from."""

    name: str
    field: str  # e.g. "spec.adapters[3]" or "LoRAAdapter ml/sql-coder"
    rank: int | None  # None: unknown yet (source not read)


@dataclass(frozen=True)
class Derived:
    """One derived value: what it is, why, and what is wrong (refusals) or unwise (warnings)."""

    value: int
    reason: str
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    concurrency: Concurrency | None = None  # derive_max_loras only: the estimate behind auto


TP_SIZES = (1, 2, 4, 8)  # spec.gpu.count's allowed values


def _splits(tp: int, model: ModelDims) -> bool:
    """vLLM's rule: attention heads divide evenly over the GPUs; KV heads divide or are replicated."""
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    return heads % tp == 0 and (kv % tp == 0 if kv >= tp else tp % kv == 0)


def tensor_parallel_problems(tp: int, model: ModelDims) -> tuple[str, ...]:
    """The refusal when spec.gpu.count cannot split the model's heads (vLLM would not start)."""
    if _splits(tp, model):
        return ()
    fits = [str(n) for n in TP_SIZES if _splits(n, model)]
    choice = ", ".join(fits[:-1]) + f" or {fits[-1]}" if len(fits) > 1 else fits[0]
    return (
        f"spec.gpu.count={tp} does not divide {model.key}'s {model.num_attention_heads} attention heads "
        f"({model.num_key_value_heads} KV heads); vLLM refuses to start: set spec.gpu.count to {choice}",
    )


def derive_max_model_len(spec: LoRAPoolSpec, model: ModelDims) -> Derived:
    """--max-model-len: the spec's value, else the model's context capped at DEFAULT_MAX_MODEL_LEN."""
    if spec.vllm.max_model_len:
        value = spec.vllm.max_model_len
        reason = f"{value}: set in spec.vllm.maxModelLen"
    else:
        value = min(model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        reason = f"{value}: the model's context, at most {DEFAULT_MAX_MODEL_LEN}"
    if value <= model.max_position_embeddings:
        return Derived(value, reason)
    problem = (
        f"spec.vllm.maxModelLen={value} exceeds the model's context {model.max_position_embeddings}; "
        f"set it to <= {model.max_position_embeddings}"
    )
    return Derived(value, reason, problems=(problem,))


def derive_max_lora_rank(lora: LoraSpec, adapters: Sequence[AdapterRank]) -> Derived:
    """--max-lora-rank: the smallest vLLM rank >= the largest adapter rank, or the spec's value, checked."""
    largest_allowed = VLLM_RANKS[-1]
    known = [(a, a.rank) for a in adapters if a.rank is not None]
    problems = [
        f"{a.field}.rank={r} exceeds vLLM's largest rank {largest_allowed}; "
        f"retrain at <= {largest_allowed} or drop the adapter"
        for a, r in known
        if r > largest_allowed
    ]
    servable = [(a, r) for a, r in known if r <= largest_allowed]
    largest = max(servable, key=lambda pair: pair[1], default=None)
    if lora.max_lora_rank == AUTO:
        return Derived(*_auto_rank(largest, [a.name for a in adapters if a.rank is None]), problems=tuple(problems))
    rank = int(lora.max_lora_rank)
    why = f"{rank}: set in spec.lora.maxLoraRank"
    problems += [
        f"spec.lora.maxLoraRank={rank} is below {a.field} ({a.name}) rank {r}; vLLM would refuse "
        f"to load it: set maxLoraRank to {vllm_rank_for(r)} or 'auto'"
        for a, r in servable
        if r > rank
    ]
    if largest is not None and vllm_rank_for(largest[1]) < rank:
        why += f" (auto would be {vllm_rank_for(largest[1])}: every slot pays for rank {rank})"
    return Derived(rank, why, problems=tuple(problems))


def _auto_rank(largest: tuple[AdapterRank, int] | None, unknown: Sequence[str]) -> tuple[int, str]:
    if largest is None:
        rank = DEFAULT_RANK
        why = f"{DEFAULT_RANK} (vLLM's default): no adapter rank known yet"
    else:
        adapter, adapter_rank = largest
        rank = vllm_rank_for(adapter_rank)
        rounded = "" if rank == adapter_rank else f", rounded up to vLLM's allowed rank {rank}"
        why = f"{rank}: largest adapter rank is {adapter_rank} ({adapter.name}){rounded}"
    if unknown:
        why += f"; rank unknown for {_names(unknown)}, assumed <= {rank}"
    return rank, why


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def derive_max_cpu_loras(
    spec: LoRAPoolSpec,
    model: ModelDims,
    n_adapters: int,
    rank: int,
    max_loras: int,
    budget: Budget,
    *,
    dtype_size: int,
) -> Derived:
    """--max-cpu-loras: as many adapters of the pool's max rank as pod memory holds, >= max-loras.

    Sized by the rank bucket, not the adapter count: the cache fills on demand, so a large
    capacity costs nothing until used, and adding adapters does not change the flag.
    """
    weights_total = budget.weights_bytes * spec.gpu.count
    host_bytes = pod_memory_bytes(spec, weights_total)
    per_adapter = adapter_host_bytes(model, rank=rank, dtype_size=dtype_size)
    host_fit = max(0, (host_bytes - weights_total - HOST_RUNTIME_BYTES) // per_adapter)
    if spec.lora.max_cpu_loras != AUTO:
        return _explicit_cpu_loras(int(spec.lora.max_cpu_loras), max_loras, host_fit, host_bytes, per_adapter)
    value = int(max(max_loras, host_fit))
    if value == max_loras and host_fit < max_loras:
        why = f"{value}: at least maxLoras (vLLM requires max-cpu-loras >= max-loras)"
    elif host_fit >= n_adapters:
        why = (
            f"{value}: pod memory {gb(host_bytes)} minus weights and runtime caches {host_fit} adapters of "
            f"rank <= {rank} ({gb(per_adapter)} each); all {n_adapters} fit, with room to add more without a restart"
        )
    else:
        why = (
            f"{value} of {n_adapters}: pod memory {gb(host_bytes)} minus weights and runtime caches {host_fit} "
            f"adapters of {gb(per_adapter)}; the rest load from disk on a miss (~40-500 ms): raise "
            "spec.vllm.resources.limits.memory to cache more"
        )
    return Derived(value, why)


def _explicit_cpu_loras(value: int, max_loras: int, host_fit: int, host_bytes: int, per_adapter: int) -> Derived:
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    if value < max_loras:
        problems = (
            f"spec.lora.maxCpuLoras={value} is below maxLoras={max_loras}; vLLM refuses to start: "
            f"set maxCpuLoras >= {max_loras} or 'auto'",
        )
    if value > host_fit:
        warnings = (
            f"spec.lora.maxCpuLoras={value} adapters of up to {gb(per_adapter)} may not fit in pod memory "
            f"{gb(host_bytes)}; raise spec.vllm.resources.limits.memory",
        )
    return Derived(value, f"{value}: set in spec.lora.maxCpuLoras", problems=problems, warnings=warnings)
