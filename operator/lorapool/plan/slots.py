"""--max-loras: how many adapters' LoRA buffers each GPU holds (its slots), and why. Pure.

Called by ``plan.planner.plan_pool``. A slot is worth having while a full batch holds that many
distinct adapters (``plan.sizing``'s concurrency estimate), plus spares while they are cheap
(``slot_headroom``), bounded by ``maxNumSeqs`` and a KV-cache floor (``slot_fit``): every slot's
buffer is taken from the KV cache before it is sized. ``kv_cache_problem`` refuses slots that
leave less KV cache than one sequence. The operator's sizing loop (``controller.tuning``) moves
the value within the same bounds (``tuned``). Whether a changed value restarts the engines now is
``controller.replan``'s call (a settle window, a band of small moves kept, approval; docs/sizing.md).
"""

from __future__ import annotations

from lorapool.api.models import AUTO, LoRAPoolSpec
from lorapool.plan.flags import DEFAULT_MAX_MODEL_LEN, Derived
from lorapool.plan.memory import Budget, gb, lora_buffer_bytes
from lorapool.plan.sizing import Concurrency, estimate_concurrency


def _floor(spec: LoRAPoolSpec, budget: Budget, one_seq_bytes: int) -> tuple[int, str]:
    """The KV-cache floor LoRA buffers may not cross, in bytes and in words."""
    lora = spec.lora
    before = budget.before_lora_bytes
    floor_bytes = max(lora.min_kv_cache_sequences * one_seq_bytes, int(lora.min_kv_cache_fraction * before))
    words = (
        f"max({lora.min_kv_cache_sequences} x {_len(spec, budget)}-token sequences, "
        f"{lora.min_kv_cache_fraction:.0%} of {gb(before)})"
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
            f"spec.lora: even one LoRA slot at rank {rank} ({gb(slot)}) leaves the KV cache below its floor of "
            f"{gb(floor_bytes)} ({floor}); lower spec.vllm.maxModelLen, "
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
            f"each slot at rank {rank} costs {gb(slot)} and more would push the KV cache below {floor}"
        )
    return (
        f"{value} of {n_adapters} adapters: each slot at rank {rank} costs {gb(slot)}; more would push "
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
            f"the spares cost {gb(spare)} at rank {rank}, {spare / kv_bytes:.1%} of the KV cache, within {limit}"
        )
    if value >= max(MIN_SLOTS, 1 << (need - 1).bit_length()):
        return f"{each} ({gb(slot * value)} at rank {rank})"
    up = 1 << (need - 1).bit_length()
    up = up * 2 if up == need else up
    restart = (
        "adding an adapter restarts the pods"
        if demand >= n_adapters
        else "the estimate moves slowly as adapters are added"
    )
    return (
        f"{each}, no spare: the next size up, {up} slots, costs {gb((up - need) * slot)} more at rank {rank}, "
        f"{(up - need) * slot / kv_bytes:.1%} of the KV cache, above {limit}; {restart}"
    )


def _len(spec: LoRAPoolSpec, budget: Budget) -> int:
    return spec.vllm.max_model_len or min(budget.model.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)


def kv_cache_problem(spec: LoRAPoolSpec, slots: int, rank: int, lora: int, budget: Budget, one_seq: int) -> str | None:
    """The refusal when the chosen slots leave less KV cache than one full-length sequence."""
    kv = budget.before_lora_bytes - lora
    if kv >= one_seq:
        return None
    return (
        f"spec.lora: {slots} slots at rank {rank} take {gb(lora)}, leaving {gb(max(kv, 0))} of KV cache, "
        f"less than one {_len(spec, budget)}-token sequence ({gb(one_seq)}); vLLM would fail to start: lower "
        "spec.lora.maxLoras or maxLoraRank, or spec.vllm.maxModelLen"
    )
