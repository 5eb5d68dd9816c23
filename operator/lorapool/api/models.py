"""The lorapool.io/v1alpha1 API: LoRAPool and LoRAAdapter as pydantic models. Pure.

One source of truth: the CRDs in ``crds/`` are generated from these models
(`lorapool crds`), so a field's description here is what ``kubectl explain`` shows.
Rules the OpenAPI schema can carry live in ``Field`` constraints; rules across
fields are CEL expressions attached with ``cel()`` and enforced here too by
validators, so `lorapool plan` refuses offline exactly what the API server refuses.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from lorapool.api.common import (
    ADAPTER_SOURCE,
    BASE_MODEL_SOURCE,
    DNS_SUBDOMAIN,
    HTTP_URL,
    REVISION,
    SHA256,
    Dtype,
    FailureMode,
    FrontDoor,
    RouterPolicy,
    dns_label,
)
from lorapool.api.peft import VLLM_RANKS
from lorapool.api.traffic import AdapterTraffic

GROUP = "lorapool.io"
VERSION = "v1alpha1"
API_VERSION: Final = "lorapool.io/v1alpha1"  # GROUP/VERSION, spelled out so its type is the Literal below
AUTO: Final = "auto"

# A supported release (api.vllm_versions: the DEFAULT row's image; tests/api/test_vllm_versions.py
# checks they agree). Changing it rolls every pool that does not set spec.vllm.image (CHANGELOG).
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.34.0"
DEFAULT_LORAPOOL_IMAGE = "ghcr.io/lorapool/lorapool:0.1.0"


ADAPTER_NAME = dns_label("sql-coder")
POOL_NAME = dns_label("llama3-8b")


def cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """Attach CEL ``x-kubernetes-validations`` (rule, message) to a model or field schema."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class Spec(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=None)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class Wire(Spec):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=_camel)


class ModelArchitecture(Wire):
    """Model dimensions, for a base model missing from lorapool's built-in table."""

    hidden_size: int = Field(ge=1, description="Hidden size (config.json hidden_size).")
    intermediate_size: int = Field(ge=1, description="MLP intermediate size (config.json intermediate_size).")
    num_layers: int = Field(ge=1, description="Transformer layers (config.json num_hidden_layers).")
    num_attention_heads: int = Field(ge=1, description="Attention heads (num_attention_heads).")
    num_key_value_heads: int = Field(ge=1, description="KV heads (num_key_value_heads; GQA).")
    head_dim: int | None = Field(
        default=None, ge=1, description="Per-head dim; default hidden_size/num_attention_heads."
    )
    vocab_size: int = Field(ge=1, description="Vocabulary size (vocab_size).")
    num_parameters: int = Field(ge=1, description="Total parameters, for the weights' memory (e.g. 8030261248).")
    max_position_embeddings: int = Field(default=8192, ge=1, description="Longest context the model supports.")
    embedding_lora: bool = Field(
        default=True,
        description="Whether vLLM allocates LoRA buffers for embeddings/LM head (true for Llama-style models).",
    )


class BaseModelSpec(Wire):
    """The base model every replica loads once and every adapter shares."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description="Model id served as the base (vLLM --served-model-name), e.g. meta-llama/Meta-Llama-3-8B-Instruct.",
    )
    source: Annotated[str, BASE_MODEL_SOURCE] = Field(
        max_length=1024,
        description="Where the weights come from: hf://org/repo, s3://bucket/prefix, pvc://claim/path or file:///path.",
    )
    revision: Annotated[str, REVISION] | None = Field(
        default=None, max_length=128, description="Hugging Face revision (branch, tag or commit)."
    )
    dtype: Dtype = Field(default=Dtype.AUTO, description="Weight dtype passed to vLLM --dtype.")
    architecture: ModelArchitecture | None = Field(
        default=None, description="Dimensions override; needed only for models lorapool does not know."
    )


class Toleration(Wire):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


GpuProduct = Literal["A100-80GB", "A100-40GB", "H100-80GB", "L40S"]


class GpuSpec(Wire):
    """The GPU each replica runs on; decides node placement and the memory budget."""

    product: GpuProduct = Field(description="GPU model; pods land only on nodes whose GFD label matches.")
    count: Literal[1, 2, 4, 8] = Field(default=1, description="GPUs per replica (vLLM --tensor-parallel-size).")
    node_selector: dict[str, str] | None = Field(
        default=None, description="Replaces the node selector derived from product (nvidia.com/gpu.product)."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, description="Replaces the default toleration of the nvidia.com/gpu taint."
    )


RankValue = Annotated[int, Field(ge=1, le=512)]


class AdapterSpec(Wire):
    """One LoRA adapter served by the pool."""

    name: Annotated[str, ADAPTER_NAME] = Field(
        max_length=63,
        description='Adapter id clients send as "model"; a DNS-1123 label.',
    )
    source: Annotated[str, ADAPTER_SOURCE] = Field(
        max_length=1024,
        description="PEFT adapter location: hf://org/repo, s3://bucket/prefix/, https://host/adapter.tar.gz, pvc://claim/path or file:///path.",
    )
    revision: Annotated[str, REVISION] | None = Field(
        default=None, max_length=128, description="Revision (hf branch/tag/commit); a change hot-swaps the adapter."
    )
    rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        examples=[16],
        description="LoRA rank r (largest of r and rank_pattern); read from adapter_config.json when omitted.",
    )
    sha256: Annotated[str, SHA256] | None = Field(
        default=None,
        max_length=64,
        description="Expected sha256 (archive bytes, or adapter_model.safetensors for directories).",
    )
    traffic: AdapterTraffic | None = Field(
        default=None,
        description="How the router treats this adapter's requests: priority (critical, standard, sheddable) and "
        "rate limits for the whole pool (429 with Retry-After over them); default: standard, no limits.",
    )


IntOrAuto = int | Literal["auto"]

_RANKS_CEL = "[" + ", ".join(map(str, VLLM_RANKS)) + "]"
_LORA_CEL = cel(
    (
        "!has(self.maxLoras) || !has(self.maxCpuLoras) || type(self.maxLoras) == string "
        "|| type(self.maxCpuLoras) == string || self.maxCpuLoras >= self.maxLoras",
        "maxCpuLoras must be >= maxLoras (vLLM refuses to start otherwise): set maxCpuLoras >= maxLoras or 'auto'",
    ),
    (
        "!has(self.tuning) || !has(self.tuning.apply) || !self.tuning.apply || !has(self.maxLoras) "
        "|| type(self.maxLoras) == string",
        "maxLoras must be 'auto' when tuning.apply is true (an explicit maxLoras wins over the sizing loop): "
        "set maxLoras to 'auto' or tuning.apply to false",
    ),
)


class SizingTuning(Wire):
    """The closed sizing loop: how status.recommendation's --max-loras is applied (opt-in)."""

    apply: bool = Field(
        default=False,
        description="Apply status.recommendation.maxLoras to the engines (rolls the engine pods); "
        "false = recommend only. Needs maxLoras 'auto'.",
    )
    min_period_seconds: int = Field(
        default=1800,
        ge=60,
        le=7 * 86400,
        description="At most one change (or rollback) per this many seconds.",
    )
    max_step_factor: float = Field(
        default=2.0,
        ge=1.1,
        le=8.0,
        description="One change moves maxLoras at most by this factor up or down (bounded steps).",
    )
    rollback_margin: float = Field(
        default=0.10,
        ge=0.0,
        le=1.0,
        description="Roll a change back when, over an equal window after it, p99 TTFT is higher or goodput "
        "lower than before by more than this fraction.",
    )


# Rules of the int-or-'auto' fields, on the fields themselves so the API server names them.
_AUTO_OR_POSITIVE = "type(self) == string ? self == 'auto' : self >= 1"


def _int_or_auto_schema(name: str, rule: str, message: str) -> dict[str, Any]:
    return {"x-kubernetes-int-or-string": True, **cel((rule, f"{name} {message}"))}


class LoraSpec(Wire):
    """vLLM LoRA sizing. 'auto' derives each value from the adapters' real ranks and the GPU."""

    model_config = ConfigDict(json_schema_extra=_LORA_CEL)

    max_loras: IntOrAuto = Field(
        default=AUTO,
        description="GPU adapter slots (vLLM --max-loras): most distinct adapters in one batch. 'auto' or a number.",
        json_schema_extra=_int_or_auto_schema(
            "maxLoras", _AUTO_OR_POSITIVE, "must be 'auto' or an integer >= 1, e.g. 8"
        ),
    )
    max_lora_rank: IntOrAuto = Field(
        default=AUTO,
        description="vLLM --max-lora-rank: 'auto' (smallest allowed rank >= the largest adapter rank) or one of 1, 8, 16, 32, 64, 128, 256, 320, 512.",
        json_schema_extra=_int_or_auto_schema(
            "maxLoraRank",
            f"type(self) == string ? self == 'auto' : self in {_RANKS_CEL}",
            "must be 'auto' or one of vLLM's ranks 1, 8, 16, 32, 64, 128, 256, 320, 512",
        ),
    )
    max_cpu_loras: IntOrAuto = Field(
        default=AUTO,
        description="vLLM --max-cpu-loras (CPU LRU cache of adapters): 'auto' (as many adapters of maxLoraRank as the engine container's memory holds after weights and runtime, at least maxLoras; not the adapter count) or a number >= maxLoras.",
        json_schema_extra=_int_or_auto_schema(
            "maxCpuLoras", _AUTO_OR_POSITIVE, "must be 'auto' or an integer >= 1, e.g. 32"
        ),
    )
    dtype: Dtype = Field(default=Dtype.AUTO, description="vLLM --lora-dtype.")
    target_modules: list[str] | None = Field(
        default=None, description="vLLM --lora-target-modules: restricts LoRA buffers to these modules."
    )
    min_kv_cache_sequences: int = Field(
        default=4,
        ge=1,
        le=4096,
        description="auto maxLoras keeps the KV cache able to hold at least this many maxModelLen sequences.",
    )
    min_kv_cache_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=0.95,
        description="auto maxLoras never lets LoRA buffers take more than 1-this of the memory the KV cache would have had.",
    )
    headroom_kv_cache_fraction: float = Field(
        default=0.05,
        ge=0.0,
        le=0.5,
        description="auto maxLoras adds spare slots above the adapter count (so adding an adapter does not restart "
        "pods) only while all spares together cost at most this fraction of the KV cache; 0 = a slot per adapter.",
    )
    tuning: SizingTuning | None = Field(
        default=None,
        description="The sizing loop: status.recommendation is always written; tuning.apply applies it.",
    )

    @field_validator("max_loras", "max_cpu_loras", mode="before")
    @classmethod
    def _int_or_auto(cls, value: Any) -> Any:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be 'auto' or an integer >= 1, e.g. 8 (got {value!r})")

    @field_validator("max_lora_rank", mode="before")
    @classmethod
    def _vllm_rank(cls, value: Any) -> Any:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value in VLLM_RANKS):
            return value
        allowed = ", ".join(map(str, VLLM_RANKS))
        raise ValueError(f"{value!r} is not a vLLM rank; use 'auto' or one of {allowed}")

    @model_validator(mode="wrap")
    @classmethod
    def _cpu_holds_gpu(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> LoraSpec:
        """maxCpuLoras >= maxLoras, reported beside the other fields' problems, not instead of them."""
        raw = value if isinstance(value, dict) else {}
        gpu, cpu = raw.get("maxLoras", raw.get("max_loras")), raw.get("maxCpuLoras", raw.get("max_cpu_loras"))
        problems: list[InitErrorDetails] = []
        if isinstance(gpu, int) and isinstance(cpu, int) and not isinstance(gpu | cpu, bool) and 1 <= cpu < gpu:
            message = f"maxCpuLoras={cpu} is below maxLoras={gpu}; vLLM refuses to start: set maxCpuLoras >= maxLoras or 'auto'"
            problems.append({"type": _custom("value_error", message), "loc": (), "input": value})
        tuning = raw.get("tuning")
        if isinstance(tuning, dict) and tuning.get("apply") is True and isinstance(gpu, int):
            message = (
                f"tuning.apply needs maxLoras 'auto' (maxLoras={gpu} wins over the sizing loop): "
                "set maxLoras to 'auto' or tuning.apply to false"
            )
            problems.append({"type": _custom("value_error", message), "loc": (), "input": value})
        result: LoraSpec = validate_reporting_all(handler, value, problems, cls.__name__)
        return result


class EnvVar(Wire):
    """A container environment variable (core/v1 EnvVar; valueFrom passed through)."""

    name: str = Field(min_length=1)
    value: str | None = None
    value_from: dict[str, Any] | None = None


class VllmSpec(Wire):
    """The vLLM engine container."""

    image: str = Field(
        default=DEFAULT_VLLM_IMAGE,
        min_length=1,
        description="vLLM OpenAI server image; supported releases: docs/vllm.md.",
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="vLLM --max-model-len; default: the model's context length, at most 8192."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.1, le=0.99, description="vLLM --gpu-memory-utilization: fraction of GPU memory vLLM may use."
    )
    max_num_seqs: int = Field(default=256, ge=1, le=4096, description="vLLM --max-num-seqs: most sequences in a batch.")
    extra_args: list[str] = Field(
        default_factory=list, description="More vLLM flags, appended verbatim (e.g. --enable-prefix-caching)."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for the vLLM container.")
    resources: dict[str, Any] | None = Field(
        default=None,
        description="Container resources (core/v1 ResourceRequirements); nvidia.com/gpu is always set from gpu.count.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
    )

    @field_validator("extra_args")
    @classmethod
    def _no_managed_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                why = " (a key in extraArgs is readable by anyone who can read the pool)" if flag == "--api-key" else ""
                raise ValueError(
                    f"{flag} is set by lorapool; remove it from extraArgs and set {MANAGED_FLAGS[flag]} instead{why}"
                )
        return args


# vLLM flags lorapool sets, and the spec field that sets each; extraArgs may not repeat them.
MANAGED_FLAGS: Final[dict[str, str]] = {
    "--enable-lora": "spec.adapters (LoRA is always on)",
    "--max-loras": "spec.lora.maxLoras",
    "--max-lora-rank": "spec.lora.maxLoraRank",
    "--max-cpu-loras": "spec.lora.maxCpuLoras",
    "--port": "nothing (the engine listens on 8000)",
    "--tensor-parallel-size": "spec.gpu.count",
    "--served-model-name": "spec.baseModel.name",
    "--max-model-len": "spec.vllm.maxModelLen",
    "--gpu-memory-utilization": "spec.vllm.gpuMemoryUtilization",
    "--lora-dtype": "spec.lora.dtype",
    "--max-num-seqs": "spec.vllm.maxNumSeqs",
    "--api-key": "spec.security.apiKeySecretRef",
}


_CIDR_MESSAGE = "must be an IP block in CIDR notation, e.g. 10.128.0.0/23"


class GatewaySpec(Wire):
    """How a Gateway API Inference Extension gateway reaches the pool (frontDoor gateway or both; docs/gateway.md)."""

    failure_mode: FailureMode = Field(
        default=FailureMode.FAIL_CLOSE,
        description="The InferencePool's endpointPickerRef.failureMode: FailClose (the gateway answers 503 while "
        "the picker does not answer) or FailOpen (it routes to any engine, without adapter affinity).",
    )
    tls_secret_name: Annotated[str, DNS_SUBDOMAIN] | None = Field(
        default=None,
        max_length=253,
        description="kubernetes.io/tls Secret (tls.crt, tls.key) the picker serves gRPC with; default: a "
        "self-signed certificate made at start (gateways do not verify the picker's certificate by default).",
    )
    namespace: Annotated[str, dns_label("envoy-gateway-system")] | None = Field(
        default=None,
        max_length=63,
        description="Namespace of the gateway's data-plane pods (e.g. envoy-gateway-system, kgateway-system, "
        "istio-ingress): the NetworkPolicy lets them reach the picker and the engines' port 8000.",
    )
    pod_labels: dict[str, str] | None = Field(
        default=None,
        max_length=16,
        description="Labels of the gateway's data-plane pods within namespace; default: every pod of namespace.",
    )
    cidrs: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="IP blocks of a data plane outside the cluster's pods (GKE: the proxy-only subnet) that the "
        "NetworkPolicy lets reach the picker and the engines.",
        json_schema_extra={
            "items": {
                "type": "string",
                "maxLength": 43,
                **cel(("isCIDR(self) && cidr(self) == cidr(self).masked()", _CIDR_MESSAGE)),
            }
        },
    )

    message_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        le=60,
        description="The gateway's ext_proc message timeout, as set on it (Envoy: message_timeout, default 0.2; "
        "Envoy Gateway: EnvoyExtensionPolicy extProc messageTimeout): the picker holds a request for an adapter "
        "slot at most this minus 50 ms. Set it above 2 (the router's max wait) on the gateway and here to keep "
        "adapter grouping's holds; default: Envoy's 0.2.",
    )

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for i, block in enumerate(value):
            try:
                ipaddress.ip_network(block, strict=True)
            except ValueError:
                raise ValueError(f"cidrs[{i}] {block!r} {_CIDR_MESSAGE}") from None
        return value

    @property
    def admits_pods(self) -> bool:
        """Whether a NetworkPolicy can name the data plane: a namespace or IP blocks."""
        return bool(self.namespace or self.cidrs)


class DispatchSpec(Wire):
    """How the router orders requests that must wait (docs/traffic.md): the pool-level form of its flags."""

    fair: bool = Field(
        default=False,
        description="Fair dispatch: waiting requests bind by a virtual token counter per adapter, weighted by "
        "priority (critical 4, standard 2, sheddable 1), and an adapter far ahead yields a LoRA slot to one held "
        "for it. Off: waiting requests bind by priority, then oldest first.",
    )
    max_prefilling: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Requests per engine replica that have not streamed their first token; more wait in the "
        "router, where priority and fair order apply, instead of in the engine's first-come queue. 4 is what "
        "bench/ measured under a flood. Unset: no cap.",
    )
    max_inflight: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Requests per engine replica in all; more wait in the router. Costs throughput where "
        "maxPrefilling does not (an engine batches decode steps almost for free). Unset: no cap.",
    )
    max_queue_wait_seconds: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="How long a request waits for a replica below maxPrefilling / maxInflight before it is sent "
        "anyway (a cap never loses a request).",
    )


_ROUTER_CEL = cel(
    (
        "!has(self.prefixWeight) || self.prefixWeight == 0.0 || !has(self.policy) || self.policy == 'affinity'",
        "prefixWeight applies to policy affinity only (the baselines stay prompt-blind): policy must be "
        "affinity, or prefixWeight 0",
    ),
)


class RouterSpec(Wire):
    """The pool's adapter-aware router: its one OpenAI endpoint, and the endpoint picker of a gateway."""

    model_config = ConfigDict(json_schema_extra=_ROUTER_CEL)

    replicas: int = Field(default=1, ge=0, le=100, description="Router replicas.")
    policy: RouterPolicy = Field(default=RouterPolicy.AFFINITY, description="Scheduling policy.")
    image: str | None = Field(default=None, description="lorapool image for the router; default: the operator's.")
    front_door: FrontDoor = Field(
        default=FrontDoor.ROUTER,
        description="router: the HTTP router Service <pool>; gateway: an InferencePool <pool> and its endpoint "
        "picker Service <pool>-epp (the router pods, over Envoy ext_proc) for a Gateway API Inference Extension "
        "gateway, and no HTTP router Service; both: all of them. One scheduling policy serves every door.",
    )
    gateway: GatewaySpec = Field(
        default_factory=GatewaySpec, description="The gateway door's settings (frontDoor gateway or both)."
    )
    dispatch: DispatchSpec = Field(
        default_factory=DispatchSpec,
        description="How requests wait when the engines are saturated: fair dispatch and the per-replica caps "
        "(both doors).",
    )
    prefix_weight: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="Weight of the prefix scorer (policy affinity, both doors): among the replicas adapter "
        "affinity ranks alike, prefer the one recently sent the prompt's head for the same adapter, whose KV "
        "prefix cache holds it. 1.5 keeps it under adapter grouping (above 2 it can split an adapter's "
        "requests for a prefix). 0: off, the default; bench/NOTES.md regime (g) says what it measured.",
    )

    @model_validator(mode="after")
    def _prefix_needs_affinity(self) -> RouterSpec:
        if self.prefix_weight > 0 and self.policy != RouterPolicy.AFFINITY:
            raise ValueError(
                f"prefixWeight={self.prefix_weight:g} applies to policy affinity, not {self.policy.value} (the "
                "baselines stay prompt-blind): set policy affinity or prefixWeight 0"
            )
        return self

    @property
    def http(self) -> bool:
        return self.front_door in (FrontDoor.ROUTER, FrontDoor.BOTH)

    @property
    def picker(self) -> bool:
        return self.front_door in (FrontDoor.GATEWAY, FrontDoor.BOTH)


ALL: Final = "all"


class PlacementOverride(Wire):
    """Where one adapter lives whatever its load, e.g. a critical adapter pinned to every replica."""

    name: Annotated[str, ADAPTER_NAME] = Field(max_length=63, description="The adapter (inline or LoRAAdapter).")
    replicas: int | Literal["all"] = Field(
        description="'all' (every replica: pinned) or a number of replicas (clipped to the pool's size).",
        # maxLength bounds the CEL cost of the string case (1000 overrides x an unbounded string exceeds the budget).
        json_schema_extra={
            **_int_or_auto_schema(
                "replicas",
                "type(self) == string ? self == 'all' : self >= 1",
                "must be 'all' or an integer >= 1, e.g. 2",
            ),
            "maxLength": 3,
        },
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _all_or_positive(cls, value: Any) -> Any:
        if value == ALL or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be 'all' or an integer >= 1, e.g. 2 (got {value!r})")


_PLACEMENT_CEL = cel(
    (
        "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        "minReplicas must be <= maxReplicas: lower minReplicas or raise maxReplicas",
    ),
)


class PlacementSpec(Wire):
    """On how many replicas (k of N) each adapter lives; docs/placement.md.

    'auto' keeps every adapter on every replica while each replica's CPU cache (maxCpuLoras)
    holds the whole catalog, as small pools always did; past that, each adapter gets k replicas
    chosen by rendezvous hashing over stable replica slots, k following its load.
    """

    model_config = ConfigDict(json_schema_extra=_PLACEMENT_CEL)

    replicas_per_adapter: IntOrAuto = Field(
        default=AUTO,
        description="'auto' (every replica while the catalog fits each replica's maxCpuLoras, else k from each "
        "adapter's load within minReplicas..maxReplicas) or a number of replicas for every adapter.",
        json_schema_extra=_int_or_auto_schema(
            "replicasPerAdapter", _AUTO_OR_POSITIVE, "must be 'auto' or an integer >= 1, e.g. 2"
        ),
    )
    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest replicas an adapter gets under 'auto'.")
    max_replicas: int | None = Field(
        default=None, ge=1, le=1000, description="Most replicas an adapter gets under 'auto'; default: the pool's size."
    )
    scale_down_cooldown_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="Under 'auto', an adapter gives up a replica only this long after its last change (hysteresis).",
    )
    overrides: list[PlacementOverride] = Field(
        default_factory=list,
        max_length=1000,
        description="Per-adapter replicas that win over replicasPerAdapter, e.g. {name: sql-coder, replicas: all}.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("replicas_per_adapter", mode="before")
    @classmethod
    def _auto_or_positive(cls, value: Any) -> Any:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be 'auto' or an integer >= 1, e.g. 2 (got {value!r})")

    @model_validator(mode="after")
    def _bounds(self) -> PlacementSpec:
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas={self.min_replicas} is above maxReplicas={self.max_replicas}; "
                "lower minReplicas or raise maxReplicas"
            )
        seen: set[str] = set()
        for i, o in enumerate(self.overrides):
            if o.name in seen:
                raise ValueError(f"overrides[{i}].name: {o.name!r} is listed twice; keep one entry per adapter")
            seen.add(o.name)
        return self


class SecretKeyRef(Wire):
    """A key in a Secret in the pool's namespace."""

    name: Annotated[str, DNS_SUBDOMAIN] = Field(max_length=253)
    key: str = Field(min_length=1, max_length=253)


class S3Credentials(Wire):
    """S3-compatible store access for adapter and model sources."""

    secret_name: Annotated[str, DNS_SUBDOMAIN] | None = Field(
        default=None,
        max_length=253,
        description="Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.",
    )
    endpoint: Annotated[str, HTTP_URL] | None = Field(
        default=None, max_length=1024, description="S3 endpoint URL (MinIO, Ceph, R2...)."
    )
    region: str | None = Field(default=None, description="S3 region.")


class Credentials(Wire):
    """Secrets used to read models and adapters; never logged nor copied into status."""

    hugging_face: SecretKeyRef | None = Field(default=None, description="Secret key holding HF_TOKEN.")
    s3: S3Credentials | None = None


class SidecarSpec(Wire):
    """The adapter-sync sidecar in every engine pod."""

    image: str | None = Field(default=None, description="lorapool image for the sidecar; default: the operator's.")
    resources: dict[str, Any] | None = Field(
        default=None,
        description="Container resources (core/v1 ResourceRequirements).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
    )


class SecuritySpec(Wire):
    """Who may reach the engines: their runtime LoRA API loads and unloads adapters."""

    network_policy: bool = Field(
        default=True,
        description="Render NetworkPolicy <pool>-engine: engine pods accept traffic only from this pool's router "
        "pods (port 8000) and from metricsNamespace. Turn off only where another policy covers the engines.",
    )
    metrics_namespace: Annotated[str, dns_label("monitoring")] | None = Field(
        default=None,
        max_length=63,
        description="Namespace of a metrics scraper (e.g. monitoring) the NetworkPolicy lets reach the engines' "
        "port 8000 (vLLM /metrics) and the sidecars' port 8081. vLLM serves /metrics on its API port: set "
        "apiKeySecretRef too, so that namespace cannot call the LoRA API.",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the engines' API key: vLLM requires it on every /v1 route (env "
        "VLLM_API_KEY, read as --api-key), and the router and the sidecar send it as Authorization: Bearer.",
    )


_GATEWAY_NEEDS_PODS = (
    "router.frontDoor gateway or both with security.networkPolicy on needs router.gateway.namespace (where the "
    "gateway's data-plane pods run, e.g. envoy-gateway-system) or router.gateway.cidrs, so the NetworkPolicy can "
    "let the gateway reach the engines: set one, or set frontDoor to router"
)
_GATEWAY_CEL = cel(
    (
        "!has(self.router) || self.router.frontDoor == 'router' "
        "|| (has(self.security) && !self.security.networkPolicy) "
        "|| (has(self.router.gateway) && (has(self.router.gateway.namespace) "
        "|| (has(self.router.gateway.cidrs) && size(self.router.gateway.cidrs) > 0)))",
        _GATEWAY_NEEDS_PODS,
    ),
)


class LoRAPoolSpec(Wire):
    """A base model served by replicas, plus the LoRA adapters they share."""

    model_config = ConfigDict(json_schema_extra=_GATEWAY_CEL)

    base_model: BaseModelSpec = Field(description="The base model.")
    gpu: GpuSpec = Field(description="GPU per replica.")
    replicas: int = Field(default=1, ge=0, le=1000, description="Engine replicas (scale subresource).")
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        max_length=1000,
        description="Inline adapters (at most 1000); LoRAAdapter objects with spec.poolRef add more.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="vLLM LoRA sizing.")
    vllm: VllmSpec = Field(default_factory=VllmSpec, description="vLLM engine settings.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router settings.")
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec, description="Adapter-sync sidecar settings.")
    credentials: Credentials | None = Field(default=None, description="Secrets for model and adapter sources.")
    security: SecuritySpec = Field(
        default_factory=SecuritySpec, description="Who may reach the engines (NetworkPolicy, API key)."
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="On how many replicas each adapter lives (k of N)."
    )

    @field_validator("adapters", mode="wrap")
    @classmethod
    def _unique_names(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> list[AdapterSpec]:
        """Duplicate names are reported beside the adapters' other problems, not instead of them."""
        adapters: list[AdapterSpec] = validate_reporting_all(handler, value, _duplicate_names(value), cls.__name__)
        return adapters

    @model_validator(mode="after")
    def _gateway_reachable(self) -> LoRAPoolSpec:
        if self.router.picker and self.security.network_policy and not self.router.gateway.admits_pods:
            raise ValueError(_GATEWAY_NEEDS_PODS)
        return self


def _custom(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{message}", {"message": message})


def validate_reporting_all(
    handler: ValidatorFunctionWrapHandler, value: Any, problems: list[InitErrorDetails], title: str
) -> Any:
    """``handler(value)``, raising its errors and ``problems`` (checks across fields, made on the raw
    input) together: pydantic would otherwise skip a cross-field check when any field is wrong."""
    try:
        result = handler(value)
    except ValidationError as exc:
        if not problems:
            raise
        kept: list[InitErrorDetails] = [
            {"type": _custom(e["type"], e["msg"]), "loc": e["loc"], "input": e["input"]}
            for e in exc.errors(include_url=False)
        ]
        raise ValidationError.from_exception_data(exc.title, [*kept, *problems]) from None
    if problems:
        raise ValidationError.from_exception_data(title, problems)
    return result


def _duplicate_names(value: Any) -> list[InitErrorDetails]:
    """An error at ``[i].name`` for every adapter whose name an earlier one has (read before validation)."""
    first: dict[str, int] = {}
    errors: list[InitErrorDetails] = []
    for index, item in enumerate(value if isinstance(value, list) else []):
        name = item.get("name") if isinstance(item, dict) else getattr(item, "name", None)
        if not isinstance(name, str):
            continue
        if name in first:
            message = (
                f"{name!r} is also the name of spec.adapters[{first[name]}]; adapter names must be unique in a "
                f"pool, e.g. {name}-2"
            )
            errors.append({"type": _custom("duplicate_name", message), "loc": (index, "name"), "input": name})
        first.setdefault(name, index)
    return errors


class ObjectMeta(Spec):
    """The part of metadata lorapool reads."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: Annotated[str, POOL_NAME] = Field(max_length=40)
    namespace: Annotated[str, dns_label("ml")] = Field(default="default", max_length=63)
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class LoRAPool(Spec):
    """A LoRAPool resource as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: Literal["lorapool.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["LoRAPool"] = "LoRAPool"
    metadata: ObjectMeta
    spec: LoRAPoolSpec


class PoolRef(Wire):
    """The LoRAPool (same namespace) an adapter joins."""

    name: Annotated[str, POOL_NAME] = Field(max_length=40)


class LoRAAdapterSpec(Wire):
    """One adapter owned by one team, attached to a pool; its id is metadata.name."""

    pool_ref: PoolRef = Field(description="The pool that serves this adapter.")
    source: Annotated[str, ADAPTER_SOURCE] = Field(
        max_length=1024, description=AdapterSpec.model_fields["source"].description
    )
    revision: Annotated[str, REVISION] | None = Field(
        default=None, max_length=128, description=AdapterSpec.model_fields["revision"].description
    )
    rank: int | None = Field(
        default=None, ge=1, le=512, examples=[16], description=AdapterSpec.model_fields["rank"].description
    )
    sha256: Annotated[str, SHA256] | None = Field(
        default=None, max_length=64, description=AdapterSpec.model_fields["sha256"].description
    )
    traffic: AdapterTraffic | None = Field(default=None, description=AdapterSpec.model_fields["traffic"].description)


class AdapterMeta(ObjectMeta):
    """LoRAAdapter names are adapter ids, so they must be DNS-1123 labels."""

    name: Annotated[str, ADAPTER_NAME] = Field(max_length=63)


class LoRAAdapter(Spec):
    """A LoRAAdapter resource as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: Literal["lorapool.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["LoRAAdapter"] = "LoRAAdapter"
    metadata: AdapterMeta
    spec: LoRAAdapterSpec

    def as_adapter(self) -> AdapterSpec:
        """The inline form, so pools treat both kinds of adapters the same way."""
        return AdapterSpec(
            name=self.metadata.name,
            source=self.spec.source,
            revision=self.spec.revision,
            rank=self.spec.rank,
            sha256=self.spec.sha256,
            traffic=self.spec.traffic,
        )
