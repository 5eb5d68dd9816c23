"""The LoRAPool resource: its spec's root and its smaller sections (base model, GPU, vLLM, secrets). Pure.

``LoRAPoolSpec`` gathers the sections, the larger ones from their own modules
(``api.sizing`` for spec.lora, ``api.routing`` for spec.router, ``api.placement``), the
inline adapters from ``api.adapter``, and checks what spans them (unique adapter names, a
gateway the NetworkPolicy can name). ``api.crd`` generates the LoRAPool CRD from it; the
planner, ``render`` and the controller read ``LoRAPool``; ``api.models`` re-exports the names.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator
from pydantic_core import InitErrorDetails

from lorapool.api.adapter import AdapterSpec
from lorapool.api.common import (
    BASE_MODEL_SOURCE,
    DNS_SUBDOMAIN,
    HTTP_URL,
    REVISION,
    Check,
    Checked,
    Dtype,
    dns_label,
)
from lorapool.api.fields import API_VERSION, ObjectMeta, Spec, Wire, cel, custom_error, validate_reporting_all
from lorapool.api.placement import PlacementSpec
from lorapool.api.routing import RouterSpec
from lorapool.api.sizing import LoraSpec

# A supported release (api.vllm_versions: the DEFAULT row's image; tests/api/test_vllm_versions.py
# checks they agree). Changing it rolls every pool that does not set spec.vllm.image (CHANGELOG).
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.34.0"
DEFAULT_LORAPOOL_IMAGE = "ghcr.io/lorapool/lorapool:0.1.0"


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


REGISTRY_HOST = Checked(
    (
        Check(
            r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$",
            "must be a registry as oci:// sources name it, host or host:port without a scheme, "
            "e.g. registry.lorapool-system:5000",
        ),
    )
)


class OciCredentials(Wire):
    """OCI registry access for oci:// adapter sources (docs/registry.md)."""

    secret_name: Annotated[str, DNS_SUBDOMAIN] | None = Field(
        default=None,
        max_length=253,
        description="A kubernetes.io/dockerconfigjson Secret (the imagePullSecrets kind): its .dockerconfigjson "
        "logs the sidecar in to the registries it names.",
    )
    plain_http: list[Annotated[str, REGISTRY_HOST, Field(max_length=261)]] = Field(
        default_factory=list,
        max_length=32,
        alias="plainHTTP",
        description="Registries (host or host:port, as in the sources) reached over plain HTTP instead of "
        "HTTPS, e.g. an in-cluster registry; every other registry is HTTPS only.",
    )


class Credentials(Wire):
    """Secrets used to read models and adapters; never logged nor copied into status."""

    hugging_face: SecretKeyRef | None = Field(default=None, description="Secret key holding HF_TOKEN.")
    s3: S3Credentials | None = None
    oci: OciCredentials | None = None


# spec.sidecar.keepUnloaded's defaults, also the sidecar's flags' (lorapool.sidecar.keep).
DEFAULT_KEEP_UNLOADED_BYTES: Final = 2 << 30
DEFAULT_KEEP_UNLOADED_MAX_AGE_S: Final = 3600
MAX_KEEP_UNLOADED_BYTES: Final = 1 << 40
MAX_KEEP_UNLOADED_AGE_S: Final = 7 * 24 * 3600


class KeepUnloadedSpec(Wire):
    """Files of unloaded adapters each sidecar keeps on the adapter volume, so placement moving an adapter
    back loads it without a download. vLLM frees no engine memory at unload, so only disk is at stake."""

    max_bytes: int = Field(
        default=DEFAULT_KEEP_UNLOADED_BYTES,
        ge=0,
        le=MAX_KEEP_UNLOADED_BYTES,
        description="Bytes of unloaded adapters' files kept per replica, least recently used evicted first; 0 "
        "deletes an adapter's files at unload. Default 2147483648 (2 GiB): about twenty rank-16 adapters of an "
        "8B model (~0.1 GB each, lorapool plan), small next to the node disk under the adapter volume (emptyDir).",
    )
    max_age_seconds: int = Field(
        default=DEFAULT_KEEP_UNLOADED_MAX_AGE_S,
        ge=1,
        le=MAX_KEEP_UNLOADED_AGE_S,
        description="Kept files older than this are deleted. Default 3600 (1 hour): placement moves an adapter "
        "back within minutes when demand swings back; later, a fresh download is the cheaper bet than disk.",
    )


class SidecarSpec(Wire):
    """The adapter-sync sidecar in every engine pod."""

    image: str | None = Field(default=None, description="lorapool image for the sidecar; default: the operator's.")
    keep_unloaded: KeepUnloadedSpec = Field(
        default_factory=KeepUnloadedSpec,
        description="How much of unloaded adapters' files to keep for a place-back without a download.",
    )
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
            errors.append({"type": custom_error("duplicate_name", message), "loc": (index, "name"), "input": name})
        first.setdefault(name, index)
    return errors


class LoRAPool(Spec):
    """A LoRAPool resource as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: Literal["lorapool.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["LoRAPool"] = "LoRAPool"
    metadata: ObjectMeta
    spec: LoRAPoolSpec
