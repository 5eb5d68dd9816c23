"""Status models of LoRAPool and LoRAAdapter: the one shape of everything the operator writes. Pure.

The planner fills ``PlanStatus`` (and ``MemoryStatus`` is its memory breakdown), the
controller's pure status code builds ``LoRAPoolStatus`` / ``LoRAAdapterStatus``, the
operator sends ``to_patch()``, and the CRD's status schema is generated from these same
classes, so ``kubectl explain lp.status`` documents exactly what is written. Conditions
follow kstatus (Ready / Progressing / Degraded, plus abnormal-true Reconciling / Stalled),
each with a reason and a message, so ``kubectl wait --for=condition=Ready``, Flux and
Argo CD understand a pool.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lorapool.api.fields import _camel


class Status(BaseModel):
    """Base of the status models: camelCase on the wire, unknown fields (other writers') ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=_camel)

    def to_wire(self) -> dict[str, Any]:
        """The JSON the CRD expects: camelCase names, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_patch(self) -> dict[str, Any]:
        """The fields this status sets, for a JSON merge patch; those set to None are sent as null.

        A merge patch keeps what it does not mention, so a value that is no longer true (a plan
        that became invalid, a rank no longer known) must be sent as null to be removed, and a
        field the writer did not set (an invalid spec's status sets only conditions) is not sent.
        """
        wire = self.to_wire()
        fields = type(self).model_fields
        return {
            (info.alias or name): wire.get(info.alias or name)
            for name, info in fields.items()
            if name in self.model_fields_set
        }


class ConditionType(StrEnum):
    """Every condition type the operator writes."""

    READY = "Ready"
    # LoRAPool: requests are served now (an engine replica and a router ready), converged or not: what
    # a pipeline waits on to send traffic during a roll or with a replica down; Ready means converged.
    AVAILABLE = "Available"
    ACCEPTED = "Accepted"  # LoRAAdapter only: source read, rank, base model and format valid
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    RECONCILING = "Reconciling"  # kstatus: abnormal-true twin of Progressing
    STALLED = "Stalled"  # kstatus: abnormal-true, the spec cannot be served until it changes
    INFERENCE_POOL_READY = "InferencePoolReady"  # LoRAPool with the gateway door: a gateway routes to it
    ROUTER_POLICY_ACCEPTED = "RouterPolicyAccepted"  # LoRAPool: no router refused its policy document
    # LoRAPool with several routers or spec.router.sharedState: whether they share one set of books (controller.books)
    SHARED_BOOKS = "SharedBooks"
    # LoRAPool, abnormal-true while a plan change that restarts the engines waits (settling, approval,
    # announced): the old and new flags, why, and how to approve (controller.replan)
    ENGINE_RESTART_PENDING = "EngineRestartPending"
    WRITE_FAILED = "WriteFailed"  # LoRAPool, abnormal-true, only while a write failed: what, why, what to do


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def _listed(values: type[StrEnum]) -> str:
    names = [v.value for v in values]
    return ", ".join(names[:-1]) + " or " + names[-1]


class Condition(Status):
    """A kstatus-style condition."""

    type: str = Field(description=f"{_listed(ConditionType)}.")
    status: str = Field(description=f"{_listed(ConditionStatus)}.")
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable details: what happened and what to do.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="The generation this condition was computed from."
    )


def condition(type_: ConditionType, status: bool, reason: str, message: str, generation: int | None) -> Condition:
    """A condition without its timestamp (``merge_conditions`` in the controller stamps it)."""
    return Condition(
        type=type_.value,
        status=(ConditionStatus.TRUE if status else ConditionStatus.FALSE).value,
        reason=reason,
        message=message,
        observed_generation=generation,
    )


class MemoryStatus(Status):
    """Memory breakdown of one replica, per GPU (a replica with gpu.count GPUs has this on each), in bytes."""

    model_config = ConfigDict(frozen=True)

    gpu_bytes: int = Field(description="Memory of one GPU.")
    usable_bytes: int = Field(description="gpuMemoryUtilization x the memory of one GPU.")
    weights_bytes: int = Field(description="Base-model weights on one GPU (the total divided by gpu.count).")
    lora_bytes: int = Field(
        description="LoRA GPU buffers on one GPU: maxLoras slots at maxLoraRank (vLLM's allocation)."
    )
    reserve_bytes: int = Field(description="Activation and runtime reserve on one GPU.")
    kv_cache_bytes: int = Field(description="What is left for the KV cache on one GPU.")
    kv_cache_tokens: int = Field(description="Tokens the KV cache holds.")
    naive_rank: int = Field(description="The rank of the naive comparison (256).")
    naive_lora_bytes: int = Field(description="LoRA buffers on one GPU had maxLoraRank been set to 256.")
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
    warnings: list[str] | None = Field(
        default=None, description="What the plan serves but advises against (e.g. an explicit value above need)."
    )


class AdapterPhase(StrEnum):
    """An adapter's phase in the pool (docs/status.md: loaded / active / placed)."""

    PENDING = "Pending"  # metadata not read yet: its rank is unknown
    LOADING = "Loading"  # accepted (valid, in the desired set); no ready replica has loaded it yet
    READY = "Ready"  # loaded on at least one ready replica, as its sidecar reports
    FAILED = "Failed"  # vLLM would refuse it, its spec contradicts its config, or every replica failed to load it
    CONFLICT = "Conflict"  # a LoRAAdapter whose name the pool already declares inline


class AdapterStatus(Status):
    """One adapter as the pool sees it."""

    name: str
    source_kind: str = Field(default="Inline", description="Inline (spec.adapters) or LoRAAdapter.")
    rank: int | None = Field(default=None, description="Rank read from adapter_config.json or the spec.")
    phase: AdapterPhase = Field(default=AdapterPhase.PENDING, description=f"{_listed(AdapterPhase)}.")
    loaded_replicas: int | None = Field(
        default=None,
        description="Ready engine replicas whose sidecar reports this adapter loaded at the revision the spec asks for.",
    )
    message: str | None = Field(
        default=None, description="What is wrong and how to fix it, or why it is not loaded (the engine's reason)."
    )
    placed_replicas: int | None = Field(
        default=None,
        description="Replicas this adapter is placed on (told to load it): every replica until placement is on "
        "(status.placement.mode KOfN); below targetReplicas when the replicas' maxCpuLoras leave no room.",
    )
    target_replicas: int | None = Field(
        default=None,
        description="k: the replicas its load (or spec.placement) asks for, before the pool's size and capacity clip it.",
    )
    target_changed_at: str | None = Field(
        default=None, description="When targetReplicas last changed (RFC 3339): the scale-down cooldown counts from it."
    )


class AdapterProblem(Status):
    """One of a pool's worst adapters: what is wrong with it, so a truncated list still names it."""

    name: str
    source_kind: str = Field(default="Inline", description="Inline (spec.adapters) or LoRAAdapter.")
    phase: AdapterPhase = Field(description=f"{_listed(AdapterPhase)}.")
    message: str = Field(default="", description="Why, and how to fix it.")


class PlacementMode(StrEnum):
    ALL_REPLICAS = "AllReplicas"  # every replica holds every adapter (small pools, as before placement)
    K_OF_N = "KOfN"  # each adapter on its k replicas (rendezvous hashing over replica slots)


class PlacementStatus(Status):
    """How adapters are spread over the engine replicas, and why."""

    mode: PlacementMode = Field(description=f"{_listed(PlacementMode)}.")
    reason: str = Field(description="Why this mode, with the numbers it was decided from.")
    slots: int = Field(description="Replica slots adapters are placed over (spec.replicas).")
    capacity: int = Field(description="Most adapters a replica is told to hold (its maxCpuLoras).")
    unplaced: int = Field(default=0, description="Adapters no replica has room for: raise replicas or maxCpuLoras.")


class RecommendationStatus(Status):
    """The --max-loras the engines' observations support (the sizing loop; docs/sizing.md)."""

    max_loras: int = Field(description="Recommended --max-loras.")
    current: int = Field(description="--max-loras of the plan now.")
    action: str = Field(description="Keep, Grow, Shrink or InsufficientData.")
    kv_cache_bytes: int = Field(default=0, description="KV cache per GPU the change frees (negative: takes), in bytes.")
    kv_cache_tokens: int = Field(default=0, description="The same in tokens.")
    evidence: str = Field(description="What was observed, over which window, and the arithmetic.")
    window_seconds: float | None = Field(default=None, description="Length of the replicas' observation window.")
    replicas: int = Field(default=0, description="Replicas whose reports were read.")
    samples: int = Field(default=0, description="Scrapes of the engines' metrics behind it.")
    observed_at: str | None = Field(default=None, description="When the newest window closed (RFC 3339).")


class SizingStatus(Status):
    """What the sizing loop applied (spec.lora.tuning.apply) and how that change is judged."""

    applied_max_loras: int = Field(description="--max-loras the operator applies instead of auto's estimate.")
    previous_max_loras: int = Field(description="--max-loras before the last change (what a rollback returns to).")
    last_change_time: str = Field(description="When the last change or rollback was made (RFC 3339).")
    reason: str = Field(description="Why the last change was made.")
    verdict: str = Field(description="Watching (comparing an equal window after the change), Kept or RolledBack.")
    baseline_ttft_p99_seconds: float | None = Field(default=None, description="p99 TTFT over the window before.")
    baseline_goodput: float | None = Field(default=None, description="Requests/s over the window before.")
    rejected_max_loras: int | None = Field(
        default=None, description="A value rolled back; not applied again while the recommendation stays there."
    )


class EngineVersionStatus(Status):
    """The engines that run one vLLM release, as their sidecars read it (GET /version)."""

    version: str = Field(description="vLLM's own version string; 'unknown' when the engine answered none.")
    replicas: int = Field(description="Ready engine pods that report it.")
    supported: bool = Field(
        description="A release lorapool supports (docs/vllm.md): only these engines' metrics are read, by sizing "
        "and the router; set spec.vllm.image to a supported release otherwise."
    )


class LoRAPoolStatus(Status):
    """Observed state of a LoRAPool."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    plan: PlanStatus | None = None
    placement: PlacementStatus | None = None
    adapters: list[AdapterStatus] = Field(default_factory=list)
    adapter_count: int = Field(default=0, description="Adapters served (inline + LoRAAdapter).")
    adapters_truncated: bool | None = Field(
        default=None,
        description="True when status.adapters lists only some LoRAAdapter objects (every inline adapter is "
        "listed; objects past the bound are left out, the worst kept): each LoRAAdapter's own status is complete.",
    )
    adapter_phases: dict[str, int] | None = Field(
        default=None, description="How many adapters (inline + LoRAAdapter, all of them) are in each phase."
    )
    worst_adapters: list[AdapterProblem] | None = Field(
        default=None,
        max_length=20,
        description="The adapters most in need of a human (Failed and Conflict first), with their reasons; "
        "named even when status.adapters is truncated.",
    )
    replicas: int = Field(default=0, description="Engine pods that exist.")
    ready_replicas: int = Field(default=0, description="Engine pods that are Ready.")
    endpoint: str | None = Field(
        default=None, description="The pool's OpenAI endpoint (router Service URL); none with frontDoor gateway."
    )
    inference_pool: str | None = Field(
        default=None,
        description="The InferencePool (namespace/name) an HTTPRoute of a Gateway routes to (frontDoor gateway or "
        "both); see the InferencePoolReady condition.",
    )
    selector: str | None = Field(
        default=None, description="Label selector of the engine pods (for kubectl scale / HPA)."
    )
    recommendation: RecommendationStatus | None = Field(
        default=None, description="The --max-loras the engines' observed concurrency supports, and why."
    )
    sizing: SizingStatus | None = Field(
        default=None, description="The sizing loop's applied --max-loras (only with spec.lora.tuning.apply)."
    )
    engine_versions: list[EngineVersionStatus] = Field(
        default_factory=list,
        max_length=8,
        description="The vLLM releases the Ready engine pods run (two while a new image rolls out).",
    )


class LoRAAdapterStatus(Status):
    """Observed state of a LoRAAdapter."""

    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    pool: str | None = Field(default=None, description="The pool this adapter is attached to.")
    rank: int | None = Field(default=None, description="Rank read from adapter_config.json or the spec.")
    phase: AdapterPhase = Field(default=AdapterPhase.PENDING, description=f"{_listed(AdapterPhase)}.")
    loaded_replicas: int | None = Field(
        default=None,
        description="Ready engine replicas whose sidecar reports it loaded at the revision the spec asks for.",
    )
    placed_replicas: int | None = Field(
        default=None, description="Replicas it is placed on (told to load it); see the pool's status.placement."
    )
    resolved_revision: str | None = Field(
        default=None,
        description="What the loaded copies' source resolved to when fetched: the manifest digest of an oci:// "
        "tag (sha256:...), the commit of an hf:// branch; several, comma-separated, while replicas differ.",
    )
    message: str = Field(default="", description="What is wrong and how to fix it, or why it is not loaded yet.")
