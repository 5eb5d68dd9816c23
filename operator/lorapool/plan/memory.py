"""The memory model: what vLLM allocates on each GPU and in the pod, in bytes, and the budget the
flags share. Pure.

Called by the flag derivations (``plan.flags``, ``plan.slots``) and by ``plan.planner`` (the
memory breakdown in ``status.plan.memory``); ``pod_memory_bytes`` also by the renderer (the
engine container's memory). No I/O: the model's dims and the GPU come in as arguments.

Per GPU, in the order vLLM allocates (the KV cache gets the rest):
    usable   = gpu_memory_utilization x GPU memory
    weights  = parameters x dtype bytes / tensor-parallel size
    lora     = vLLM's LoRA buffers: every slot at max rank (see ``lora_buffer_bytes``)
    reserve  = CUDA context and graphs + peak activations of one scheduled batch (estimate)
    kv_cache = usable - weights - lora - reserve
In the pod: the weights, the runtime (``HOST_RUNTIME_BYTES``) and vLLM's CPU LoRA cache
(``adapter_host_bytes`` per adapter).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lorapool.api.common import Dtype
from lorapool.api.models import LoRAPoolSpec
from lorapool.api.status import MemoryStatus
from lorapool.errors import PlanError
from lorapool.plan.dims import ModelDims
from lorapool.plan.gpus import GIB, GpuType
from lorapool.plan.quantity import parse_bytes

NAIVE_RANK = 256  # the "just set it high" value people reach for; the plan shows its cost
CUDA_CONTEXT_BYTES = int(1.5 * GIB)  # CUDA context, cuBLAS workspaces and CUDA graphs, measured ~1-2 GiB
MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1's default chunked-prefill budget on A100-class GPUs
HOST_RUNTIME_BYTES = 8 * GIB  # Python, tokenizer, CUDA host buffers of a vLLM process
DEFAULT_HOST_BYTES_EXTRA = 32 * GIB  # default pod memory = weights + this


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


def gb(n: int) -> str:
    """Bytes as the reasons and refusals print them: decimal GB, one decimal; below 0.1 GB in MB (a
    rank-8 adapter's 50 MB must not read "0.0 GB")."""
    return f"{n / 1e9:.1f} GB" if n >= 100_000_000 else f"{n / 1e6:.0f} MB"


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
            f"spec.gpu: {model.key} weights need {gb(weights)} per GPU (+{gb(reserve)} runtime) but "
            f"{spec.gpu.product} x{tp} at gpuMemoryUtilization {spec.vllm.gpu_memory_utilization} gives "
            f"{gb(budget.usable_bytes)} per GPU; set spec.gpu.count to {_next_tp(model, gpu, spec, dtype_size, reserve)} "
            "or use a larger GPU",
        ]
    )


def _next_tp(model: ModelDims, gpu: GpuType, spec: LoRAPoolSpec, b: int, reserve: int) -> str:
    for tp in (2, 4, 8):
        if (
            tp > spec.gpu.count
            and model.num_parameters * b // tp + reserve < gpu.memory_bytes * spec.vllm.gpu_memory_utilization * 0.8
        ):
            return str(tp)
    return "8"


def memory_status(
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
