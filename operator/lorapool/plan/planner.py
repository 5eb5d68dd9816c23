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

from lorapool.api.common import Dtype
from lorapool.api.models import AUTO, LoRAPoolSpec, LoraSpec
from lorapool.api.peft import VLLM_RANKS, vllm_rank_for
from lorapool.api.status import MemoryStatus, PlanReasons, PlanStatus
from lorapool.errors import PlanError
from lorapool.plan.dims import ModelDims, lookup_model
from lorapool.plan.gpus import GIB, GPUS, GpuType
from lorapool.plan.quantity import parse_bytes
from lorapool.plan.sizing import Concurrency, SlotBounds, estimate_concurrency

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
class Plan:
    """vLLM flags for one pool, the memory they leave, and why each has its value."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    max_model_len: int
    tensor_parallel_size: int
    memory: MemoryStatus
    reasons: Mapping[str, str]
    model: str
    gpu: str
    warnings: tuple[str, ...] = field(default=())
    slots: SlotBounds | None = None  # what the sizing loop may choose from, and a slot's price
    concurrency: Concurrency | None = None  # the estimate behind auto maxLoras (None: explicit value)

    def to_status(self) -> PlanStatus:
        """``status.plan`` (and ``lorapool plan -o json``), in the one status model."""
        return PlanStatus(
            max_loras=self.max_loras,
            max_lora_rank=self.max_lora_rank,
            max_cpu_loras=self.max_cpu_loras,
            max_model_len=self.max_model_len,
            tensor_parallel_size=self.tensor_parallel_size,
            memory=self.memory,
            reasons=PlanReasons(
                max_loras=self.reasons["maxLoras"],
                max_lora_rank=self.reasons["maxLoraRank"],
                max_cpu_loras=self.reasons["maxCpuLoras"],
            ),
            warnings=list(self.warnings) or None,
        )


@dataclass(frozen=True)
class Derived:
    """One derived value: what it is, why, and what is wrong (refusals) or unwise (warnings)."""

    value: int
    reason: str
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    concurrency: Concurrency | None = None  # derive_max_loras only: the estimate behind auto


# Every dtype the API accepts is two bytes wide; vLLM's 'auto' loads fp32 checkpoints as fp16 too.
_DTYPE_BYTES: dict[Dtype, int] = {Dtype.AUTO: 2, Dtype.FLOAT16: 2, Dtype.BFLOAT16: 2}


def dtype_bytes(dtype: Dtype) -> int:
    """Bytes per element of a weight or LoRA dtype as spec.baseModel.dtype / spec.lora.dtype spell it."""
    return _DTYPE_BYTES[dtype]


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
    tuned: int | None = None,
) -> Plan:
    """Derive --max-loras, --max-lora-rank and --max-cpu-loras for a pool. Raises PlanError.

    Each flag has its own function returning value, reason and problems; problems are
    collected in flag order so one PlanError lists everything the user must change.
    ``tuned``: the --max-loras the sizing loop applies (``status.sizing``), used while
    ``spec.lora.maxLoras`` is auto and ``spec.lora.tuning.apply`` is on, within the same bounds.
    """
    model = resolve_dims(spec, dims)
    gpu: GpuType = GPUS[spec.gpu.product]
    b = dtype_bytes(spec.base_model.dtype)
    lb = dtype_bytes(spec.lora.dtype) if spec.lora.dtype != Dtype.AUTO else b
    memory_problems = pod_memory_problems(spec)
    early = (*tensor_parallel_problems(spec.gpu.count, model), *memory_problems)
    model_len = derive_max_model_len(spec, model)
    rank = derive_max_lora_rank(spec.lora, adapters)
    budget = memory_budget(spec, model, gpu, b, problems=[*early, *model_len.problems, *rank.problems])
    one_seq = model_len.value * budget.kv_per_token_bytes
    slots = derive_max_loras(spec, len(adapters), rank.value, budget, one_seq_bytes=one_seq, dtype_size=lb, tuned=tuned)
    lora = lora_buffer_bytes(model, max_loras=slots.value, max_rank=rank.value, dtype_size=lb, tp=spec.gpu.count)
    cpu = (
        derive_max_cpu_loras(spec, model, len(adapters), rank.value, slots.value, budget, dtype_size=lb)
        if not memory_problems  # it reads the pod's memory, which is not a quantity then
        else Derived(slots.value, "")
    )
    problems = [*early, *model_len.problems, *rank.problems, *slots.problems]
    if not problems and (kv_problem := _kv_problem(spec, slots.value, rank.value, lora, budget, one_seq)):
        problems.append(kv_problem)
    problems += cpu.problems
    if problems:
        raise PlanError(problems)
    return Plan(
        max_loras=slots.value,
        max_lora_rank=rank.value,
        max_cpu_loras=cpu.value,
        max_model_len=model_len.value,
        tensor_parallel_size=spec.gpu.count,
        memory=_memory(model, gpu, budget, lora, slots.value, lb, tp=spec.gpu.count),
        reasons={"maxLoraRank": rank.reason, "maxLoras": slots.reason, "maxCpuLoras": cpu.reason},
        model=model.key,
        gpu=gpu.product,
        warnings=(*slots.warnings, *cpu.warnings),
        slots=SlotBounds(
            current=slots.value,
            max_slots=max(1, min(slot_fit(spec, rank.value, budget, one_seq, lb), spec.vllm.max_num_seqs)),
            n_adapters=len(adapters),
            slot_bytes=lora_buffer_bytes(model, max_loras=1, max_rank=rank.value, dtype_size=lb, tp=spec.gpu.count),
            kv_per_token_bytes=budget.kv_per_token_bytes,
        ),
        concurrency=slots.concurrency,
    )


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


@dataclass(frozen=True)
class Budget:
    """Per-GPU memory before any LoRA buffer: what the flags share."""

    model: ModelDims
    gpu: GpuType
    usable_bytes: int
    weights_bytes: int  # on one GPU
    reserve_bytes: int
    kv_per_token_bytes: int

    @property
    def before_lora_bytes(self) -> int:
        """What LoRA buffers and the KV cache split between them."""
        return self.usable_bytes - self.weights_bytes - self.reserve_bytes


def memory_budget(
    spec: LoRAPoolSpec, model: ModelDims, gpu: GpuType, dtype_size: int, *, problems: Sequence[str] = ()
) -> Budget:
    """Usable memory, weights, reserve and KV bytes per token on one GPU.

    Raises PlanError (with the earlier ``problems``) when weights and runtime alone do not fit:
    no flag can fix that, only more GPUs or a larger one.
    """
    tp = spec.gpu.count
    budget = Budget(
        model=model,
        gpu=gpu,
        usable_bytes=int(gpu.memory_bytes * spec.vllm.gpu_memory_utilization),
        weights_bytes=model.num_parameters * dtype_size // tp,
        reserve_bytes=reserve_bytes(model, dtype_size=dtype_size, tp=tp, max_num_seqs=spec.vllm.max_num_seqs),
        kv_per_token_bytes=kv_bytes_per_token(model, dtype_size=dtype_size, tp=tp),
    )
    if budget.before_lora_bytes > 0:
        return budget
    weights, reserve = budget.weights_bytes, budget.reserve_bytes
    raise PlanError(
        [
            *problems,
            f"spec.gpu: {model.key} weights need {_gb(weights)} per GPU (+{_gb(reserve)} runtime) but "
            f"{spec.gpu.product} x{tp} at gpuMemoryUtilization {spec.vllm.gpu_memory_utilization} gives "
            f"{_gb(budget.usable_bytes)} per GPU; set spec.gpu.count to {_next_tp(model, gpu, spec, dtype_size, reserve)} "
            "or use a larger GPU",
        ]
    )


def _floor(spec: LoRAPoolSpec, budget: Budget, one_seq_bytes: int) -> tuple[int, str]:
    """The KV-cache floor LoRA buffers may not cross, in bytes and in words."""
    lora = spec.lora
    before = budget.before_lora_bytes
    floor_bytes = max(lora.min_kv_cache_sequences * one_seq_bytes, int(lora.min_kv_cache_fraction * before))
    words = (
        f"max({lora.min_kv_cache_sequences} x {_len(spec, budget)}-token sequences, "
        f"{lora.min_kv_cache_fraction:.0%} of {_gb(before)})"
    )
    return floor_bytes, words


def slot_fit(spec: LoRAPoolSpec, rank: int, budget: Budget, one_seq_bytes: int, dtype_size: int) -> int:
    """The most slots at ``rank`` that keep the KV cache above its floor (0: not even one)."""
    before = budget.before_lora_bytes
    slot = lora_buffer_bytes(budget.model, max_loras=1, max_rank=rank, dtype_size=dtype_size, tp=spec.gpu.count)
    floor_bytes, _ = _floor(spec, budget, one_seq_bytes)
    return int((before - floor_bytes) // slot) if before > floor_bytes else 0


def concurrency_fixed_point(
    spec: LoRAPoolSpec, n_adapters: int, budget: Budget, *, slot_bytes: int, fit: int, rounds: int = 6
) -> Concurrency:
    """The concurrency estimate at the slot count it implies: fewer slots leave more KV cache,
    which holds more sequences, which use more distinct adapters; a few rounds settle it."""
    slots = min(max(1, n_adapters), spec.vllm.max_num_seqs, max(fit, 1))
    conc = None
    for _ in range(rounds):
        kv_tokens = max(0, budget.before_lora_bytes - slots * slot_bytes) // budget.kv_per_token_bytes
        conc = estimate_concurrency(
            n_adapters, kv_tokens=kv_tokens, max_num_seqs=spec.vllm.max_num_seqs, max_model_len=_len(spec, budget)
        )
        settled = min(max(1, conc.distinct), spec.vllm.max_num_seqs, max(fit, 1))
        if settled == slots:
            break
        slots = settled
    assert conc is not None
    return conc


def derive_max_loras(
    spec: LoRAPoolSpec,
    n_adapters: int,
    rank: int,
    budget: Budget,
    *,
    one_seq_bytes: int,
    dtype_size: int,
    tuned: int | None = None,
) -> Derived:
    """--max-loras: slots for the distinct adapters a full batch holds (the concurrency estimate),
    plus spares while they are cheap, bounded by the KV-cache floor and maxNumSeqs.

    An explicit spec value wins (a warning when slots would sit empty); else a ``tuned`` value
    from the sizing loop, within the same bounds; else the estimate.
    """
    if spec.lora.max_loras != AUTO:
        return _explicit_max_loras(int(spec.lora.max_loras), n_adapters)
    lora = spec.lora
    before = budget.before_lora_bytes
    slot = lora_buffer_bytes(budget.model, max_loras=1, max_rank=rank, dtype_size=dtype_size, tp=spec.gpu.count)
    floor_bytes, floor = _floor(spec, budget, one_seq_bytes)
    fit = slot_fit(spec, rank, budget, one_seq_bytes, dtype_size)
    need = max(1, n_adapters)
    conc = concurrency_fixed_point(spec, n_adapters, budget, slot_bytes=slot, fit=fit)
    demand = max(1, conc.distinct)
    if fit < 1:
        problem = (
            f"spec.lora: even one LoRA slot at rank {rank} ({_gb(slot)}) leaves the KV cache below its floor of "
            f"{_gb(floor_bytes)} ({floor}); lower spec.vllm.maxModelLen, "
            "lora.minKvCacheSequences or the adapters' rank, or use a larger GPU"
        )
        return Derived(1, "1: nothing fits (see errors)", problems=(problem,), concurrency=conc)
    if tuned is not None and lora.tuning is not None and lora.tuning.apply:
        value = max(1, min(tuned, spec.vllm.max_num_seqs, fit))
        why = (
            f"{value}: applied by the sizing loop from the concurrency the engines reported (status.sizing; "
            f"auto's {conc.describe()})"
        )
        return Derived(value, why, concurrency=conc)
    wanted = slot_headroom(demand, slot_bytes=slot, before_lora_bytes=before, fraction=lora.headroom_kv_cache_fraction)
    value = int(min(wanted, spec.vllm.max_num_seqs, fit))
    concurrent = f" ({conc.describe()})" if demand < need else ""
    why = _auto_max_loras_why(
        spec, n_adapters, rank, value, wanted=wanted, demand=demand, slot=slot, before=before, floor=floor
    )
    return Derived(value, why + concurrent, concurrency=conc)


def _explicit_max_loras(value: int, n_adapters: int) -> Derived:
    """spec.lora.maxLoras as set: the user's value wins, with a warning when slots would sit empty."""
    warnings: tuple[str, ...] = ()
    if n_adapters and value > n_adapters:
        warnings = (f"spec.lora.maxLoras={value} exceeds the {n_adapters} adapters; slots will sit empty",)
    return Derived(value, f"{value}: set in spec.lora.maxLoras", warnings=warnings)


def _auto_max_loras_why(
    spec: LoRAPoolSpec,
    n_adapters: int,
    rank: int,
    value: int,
    *,
    wanted: int,
    demand: int,
    slot: int,
    before: int,
    floor: str,
) -> str:
    """The reason for an automatic --max-loras, by the bound that set it: the headroom wanted,
    maxNumSeqs, or the KV-cache floor (with or without spares beyond a full batch's demand)."""
    if value == wanted:
        return f"{value}: {_headroom_why(n_adapters, demand, value, slot, rank, before, spec.lora.headroom_kv_cache_fraction)}"
    if value == spec.vllm.max_num_seqs:
        return f"{value}: capped by vllm.maxNumSeqs (a batch never holds more distinct adapters)"
    if value >= demand:
        return (
            f"{value}: a GPU slot for each of the {demand} adapter(s) a full batch holds plus {value - demand} spare; "
            f"each slot at rank {rank} costs {_gb(slot)} and more would push the KV cache below {floor}"
        )
    return (
        f"{value} of {n_adapters} adapters: each slot at rank {rank} costs {_gb(slot)}; more would push "
        f"the KV cache below {floor}; the router groups requests to keep the rest in the CPU cache"
    )


MIN_SLOTS = 8  # slots are cheap at low rank (Llama-3-8B r16: ~92 MB each); 8 spares most restarts
DEFAULT_HEADROOM_FRACTION = 0.05  # spec.lora.headroomKvCacheFraction's default, named for the docs


def slot_headroom(n_adapters: int, *, slot_bytes: int, before_lora_bytes: int, fraction: float) -> int:
    """GPU slots wanted for ``n_adapters``: a slot each, plus spare slots only while they are cheap.

    vLLM's flags are fixed at start, so sizing exactly to the adapter count would roll every
    pod whenever an adapter is added; spares make adding one a ConfigMap update. Candidates
    are the powers of two from the adapter count up to max(MIN_SLOTS, next power of two), so
    the value stays put while adapters are added; the largest whose spares together cost at
    most ``fraction`` of the KV cache that a slot per adapter leaves wins, else the count itself.
    """
    need = max(1, n_adapters)
    kv_bytes = max(0, before_lora_bytes - need * slot_bytes)
    best = need
    candidate = 1 << (need - 1).bit_length()
    while candidate <= max(MIN_SLOTS, 1 << (need - 1).bit_length()):
        if (candidate - need) * slot_bytes <= fraction * kv_bytes:
            best = max(best, candidate)
        candidate *= 2
    return best


def _headroom_why(n_adapters: int, demand: int, value: int, slot: int, rank: int, before: int, fraction: float) -> str:
    """The price tag of the chosen spare slots (or why there are none)."""
    need = max(1, demand)
    kv_bytes = max(1, before - need * slot)
    each = (
        f"a GPU slot for each of the {n_adapters} adapter(s)"
        if demand >= n_adapters
        else f"a GPU slot for each of the {demand} of {n_adapters} adapters a full batch holds"
    )
    limit = f"the {fraction:.0%} limit (spec.lora.headroomKvCacheFraction)"
    if value > need:
        spare = (value - need) * slot
        return (
            f"{each} plus {value - need} spare, so adapters can be added without restarting pods; "
            f"the spares cost {_gb(spare)} at rank {rank}, {spare / kv_bytes:.1%} of the KV cache, within {limit}"
        )
    if value >= max(MIN_SLOTS, 1 << (need - 1).bit_length()):
        return f"{each} ({_gb(slot * value)} at rank {rank})"
    up = 1 << (need - 1).bit_length()
    up = up * 2 if up == need else up
    restart = (
        "adding an adapter restarts the pods"
        if demand >= n_adapters
        else "the estimate moves slowly as adapters are added"
    )
    return (
        f"{each}, no spare: the next size up, {up} slots, costs {_gb((up - need) * slot)} more at rank {rank}, "
        f"{(up - need) * slot / kv_bytes:.1%} of the KV cache, above {limit}; {restart}"
    )


def _len(spec: LoRAPoolSpec, budget: Budget) -> int:
    return spec.vllm.max_model_len or min(budget.model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)


def _kv_problem(spec: LoRAPoolSpec, slots: int, rank: int, lora: int, budget: Budget, one_seq: int) -> str | None:
    """The refusal when the chosen slots leave less KV cache than one full-length sequence."""
    kv = budget.before_lora_bytes - lora
    if kv >= one_seq:
        return None
    return (
        f"spec.lora: {slots} slots at rank {rank} take {_gb(lora)}, leaving {_gb(max(kv, 0))} of KV cache, "
        f"less than one {_len(spec, budget)}-token sequence ({_gb(one_seq)}); vLLM would fail to start: lower "
        "spec.lora.maxLoras or maxLoraRank, or spec.vllm.maxModelLen"
    )


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
            f"{value}: pod memory {_gb(host_bytes)} minus weights and runtime caches {host_fit} adapters of "
            f"rank <= {rank} ({_gb(per_adapter)} each); all {n_adapters} fit, with room to add more without a restart"
        )
    else:
        why = (
            f"{value} of {n_adapters}: pod memory {_gb(host_bytes)} minus weights and runtime caches {host_fit} "
            f"adapters of {_gb(per_adapter)}; the rest load from disk on a miss (~40-500 ms): raise "
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
            f"spec.lora.maxCpuLoras={value} adapters of up to {_gb(per_adapter)} may not fit in pod memory "
            f"{_gb(host_bytes)}; raise spec.vllm.resources.limits.memory",
        )
    return Derived(value, f"{value}: set in spec.lora.maxCpuLoras", problems=problems, warnings=warnings)


def _memory(
    model: ModelDims, gpu: GpuType, budget: Budget, lora: int, max_loras: int, dtype_size: int, *, tp: int
) -> MemoryStatus:
    """The per-GPU breakdown in status.plan.memory, with the naive rank's cost beside ours."""
    kv = budget.before_lora_bytes - lora
    naive_lora = lora_buffer_bytes(model, max_loras=max_loras, max_rank=NAIVE_RANK, dtype_size=dtype_size, tp=tp)
    naive_kv = budget.before_lora_bytes - naive_lora
    return MemoryStatus(
        gpu_bytes=gpu.memory_bytes,
        usable_bytes=budget.usable_bytes,
        weights_bytes=budget.weights_bytes,
        lora_bytes=lora,
        reserve_bytes=budget.reserve_bytes,
        kv_cache_bytes=kv,
        kv_cache_tokens=kv // budget.kv_per_token_bytes,
        naive_rank=NAIVE_RANK,
        naive_lora_bytes=naive_lora,
        naive_kv_cache_tokens=max(0, naive_kv) // budget.kv_per_token_bytes,
    )


def pod_memory_bytes(spec: LoRAPoolSpec, weights_total: int) -> int:
    """The engine container's memory: spec.vllm.resources limits/requests, else weights + 32 GiB."""
    resources = spec.vllm.resources or {}
    for section in ("limits", "requests"):
        value = (resources.get(section) or {}).get("memory")
        if value is not None:
            try:
                return parse_bytes(value, field=f"spec.vllm.resources.{section}.memory")
            except ValueError as exc:
                raise PlanError(str(exc)) from exc
    return math.ceil((weights_total + DEFAULT_HOST_BYTES_EXTRA) / GIB) * GIB


def pod_memory_problems(spec: LoRAPoolSpec) -> tuple[str, ...]:
    """The refusal of a memory quantity in spec.vllm.resources that is not one."""
    try:
        pod_memory_bytes(spec, 0)
    except PlanError as exc:
        return exc.problems
    return ()


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
