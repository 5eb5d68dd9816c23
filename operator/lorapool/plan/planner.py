"""The derivation: adapters + model dims + GPU -> vLLM LoRA flags and a memory budget. Pure.

Called by `lorapool plan` and `lorapool render` (``render.desired``), by the operator
(``controller.decide``, ``controller.tuning``) and by the benchmark. It never does I/O: ranks read
from adapter sources and a fetched ``config.json`` come in as arguments. Every derived value
carries a one-line reason a platform engineer can check, and every refusal names the field and
the fix.

``plan_pool`` runs the steps in order and collects every problem into one PlanError; each step
lives by meaning:
    plan.memory  the memory model (bytes per GPU and in the pod) and the budget the flags share
    plan.flags   --tensor-parallel-size (checked), --max-model-len, --max-lora-rank, --max-cpu-loras
    plan.slots   --max-loras: slots for a full batch's distinct adapters, spares, the KV-cache floor
    plan.sizing  the concurrency estimate behind auto --max-loras (and the sizing loop's evidence)
    plan.dims    the model's dimensions
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lorapool.api.common import Dtype
from lorapool.api.models import LoRAPoolSpec
from lorapool.api.status import MemoryStatus, PlanReasons, PlanStatus
from lorapool.errors import PlanError
from lorapool.plan.dims import ModelDims, lookup_model
from lorapool.plan.flags import (
    AdapterRank,
    Derived,
    derive_max_cpu_loras,
    derive_max_lora_rank,
    derive_max_model_len,
    tensor_parallel_problems,
)
from lorapool.plan.gpus import GPUS, GpuType
from lorapool.plan.memory import (
    dtype_bytes,
    lora_buffer_bytes,
    memory_budget,
    memory_status,
    pod_memory_bytes,
    pod_memory_problems,
)
from lorapool.plan.sizing import Concurrency, SlotBounds
from lorapool.plan.slots import derive_max_loras, kv_cache_problem, slot_fit

# AdapterRank (the planner's input), lora_buffer_bytes and pod_memory_bytes (read by the renderer)
# are re-exported: importers keep reading them from here.
__all__ = ["AdapterRank", "Plan", "lora_buffer_bytes", "plan_pool", "pod_memory_bytes", "resolve_dims"]


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
    if not problems and (kv_problem := kv_cache_problem(spec, slots.value, rank.value, lora, budget, one_seq)):
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
        memory=memory_status(model, gpu, budget, lora, slots.value, lb, tp=spec.gpu.count),
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
