"""Status models of LoRAPool and LoRAAdapter. Pure.

The operator writes these; the CRD schema is generated from them so that
``kubectl explain lp.status`` documents what users read. Conditions follow the
kstatus convention (Ready / Progressing / Degraded, each with reason and message),
so ``kubectl wait --for=condition=Ready``, Flux and Argo CD understand a pool.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from lorapool.api.models import _camel


class Status(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=_camel)


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class Condition(Status):
    """A kstatus-style condition."""

    type: str = Field(description="Ready, Progressing or Degraded.")
    status: str = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details: what happened and what to do.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="The generation this condition was computed from."
    )


class MemoryStatus(Status):
    """Per-GPU memory breakdown of one replica, in bytes."""

    gpu_bytes: int = Field(description="Memory of one GPU.")
    usable_bytes: int = Field(description="gpuMemoryUtilization x GPU memory x GPUs.")
    weights_bytes: int = Field(description="Base-model weights, all GPUs of a replica.")
    lora_bytes: int = Field(description="LoRA GPU buffers: maxLoras slots at maxLoraRank (vLLM's allocation).")
    reserve_bytes: int = Field(description="Activation and runtime reserve.")
    kv_cache_bytes: int = Field(description="What is left for the KV cache.")
    kv_cache_tokens: int = Field(description="Tokens the KV cache holds.")
    naive_rank: int = Field(description="The rank of the naive comparison (256).")
    naive_lora_bytes: int = Field(description="LoRA buffers had maxLoraRank been set to 256.")
    naive_kv_cache_tokens: int = Field(description="KV tokens left with the naive rank (0 = does not fit).")


class PlanReasons(Status):
    max_loras: str = Field(description="Why maxLoras has its value.")
    max_lora_rank: str = Field(description="Why maxLoraRank has its value.")
    max_cpu_loras: str = Field(description="Why maxCpuLoras has its value.")


class PlanStatus(Status):
    """The derived vLLM LoRA flags and why."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    max_model_len: int
    tensor_parallel_size: int
    memory: MemoryStatus
    reasons: PlanReasons


class AdapterPhase(StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    FAILED = "Failed"
    CONFLICT = "Conflict"


class AdapterStatus(Status):
    """One adapter as the pool sees it."""

    name: str
    source_kind: str = Field(default="Inline", description="Inline (spec.adapters) or LoRAAdapter.")
    rank: int | None = Field(default=None, description="Rank read from adapter_config.json or the spec.")
    phase: AdapterPhase = Field(default=AdapterPhase.PENDING, description="Pending, Ready, Failed or Conflict.")
    loaded_replicas: int | None = Field(default=None, description="Replicas where the sidecar reports it loaded.")
    message: str = Field(default="", description="What is wrong and how to fix it.")


class LoRAPoolStatus(Status):
    """Observed state of a LoRAPool."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    plan: PlanStatus | None = None
    adapters: list[AdapterStatus] = Field(default_factory=list)
    adapter_count: int = Field(default=0, description="Adapters served (inline + LoRAAdapter).")
    replicas: int = Field(default=0, description="Engine pods that exist.")
    ready_replicas: int = Field(default=0, description="Engine pods that are Ready.")
    endpoint: str | None = Field(default=None, description="The pool's OpenAI endpoint (router Service URL).")
    selector: str | None = Field(
        default=None, description="Label selector of the engine pods (for kubectl scale / HPA)."
    )


class LoRAAdapterStatus(Status):
    """Observed state of a LoRAAdapter."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pool: str | None = Field(default=None, description="The pool this adapter is attached to.")
    rank: int | None = None
    phase: AdapterPhase = AdapterPhase.PENDING
    loaded_replicas: int | None = None
    message: str = ""
