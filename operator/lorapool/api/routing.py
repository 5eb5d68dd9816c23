"""``spec.router``: the pool's front doors (HTTP router, gateway endpoint picker) and how requests wait. Pure.

``RouterSpec`` picks the scheduling policy and the door; ``GatewaySpec`` says how a Gateway
API Inference Extension gateway reaches the pool; ``DispatchSpec`` is the pool-level form of
the router's dispatch flags. Read by ``render`` (manifests, gateway) and the controller;
used by ``api.pool``; ``api.models`` re-exports the names.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from lorapool.api.common import DNS_SUBDOMAIN, Check, Checked, FailureMode, FrontDoor, RouterPolicy, dns_label
from lorapool.api.fields import Wire, cel

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


# --- spec.router.sharedState (docs/high-availability.md) ---------------------------------------

_HOST = r"([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])"
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# A URL with '@' passes the field's own rules: the API server prints the value of a string that
# breaks one, and that one carries a password. The object's rule refuses it, printing "object".
CREDENTIALS_IN_URL = (
    "url must not carry credentials (user:password@): put them in a Secret named by credentialsSecret, e.g. "
    "url: rediss://cache.example:6380/2 with credentialsSecret: {name: books-acl}"
)
SHARED_STATE_URL = Checked(
    (
        Check(r"^(rediss?://|.*@)", "must start with redis:// or rediss:// (TLS), e.g. redis://books.cache.svc:6379/0"),
        Check(
            rf"^(rediss?://{_HOST}(:{_PORT})?(/([0-9]|1[0-5]))?$|.*@)",
            "must be redis[s]://HOST[:PORT][/DB] with PORT 1-65535 and DB 0-15, nothing after, e.g. "
            "rediss://cache.example:6380/2",
            when="redis",
        ),
    )
)
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|k|M|G)?$")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
MIN_STORE_BYTES, MAX_STORE_BYTES = 8 * 2**20, 64 * 2**30
_MEMORY_MESSAGE = "must be a Kubernetes quantity from 8Mi to 64Gi, e.g. 64Mi"


def quantity_bytes(value: str) -> int | None:
    """Bytes in a memory quantity such as 64Mi; None when it is not one (the forms a store's size needs)."""
    match = _QUANTITY.match(value.strip())
    return None if match is None else int(float(match.group(1)) * _UNITS[match.group(2) or ""])


class StoreCredentials(Wire):
    """The Secret (in the pool's namespace) holding the store's ACL user and password (requirepass)."""

    name: Annotated[str, DNS_SUBDOMAIN] = Field(max_length=253, description="The Secret's name.")
    username_key: str = Field(
        default="username",
        min_length=1,
        max_length=253,
        description="Key of the ACL user name; optional in the Secret (absent: the default user).",
    )
    password_key: str = Field(
        default="password", min_length=1, max_length=253, description="Key of the password; required in the Secret."
    )


class RenderedStore(Wire):
    """A memory-only Redis the operator runs for the pool: Deployment and Service <pool>-books."""

    image: str | None = Field(
        default=None,
        max_length=512,
        description="Image with redis-server on its PATH (Redis 7 or Valkey); default: lorapool-books beside the "
        "operator's image (<registry>/lorapool-books:<tag>, the Dockerfile's books target).",
    )
    max_memory: str = Field(
        default="64Mi",
        max_length=32,
        description="The store's --maxmemory, with policy noeviction: a full store refuses writes (the routers "
        "count it and decide from their own books), it never drops live books. Sizes the container's memory.",
        json_schema_extra=cel(
            (
                "isQuantity(self) && quantity(self).compareTo(quantity('8Mi')) >= 0 && "
                "quantity(self).compareTo(quantity('64Gi')) <= 0",
                f"maxMemory {_MEMORY_MESSAGE}",
            )
        ),
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        description="Container resources (core/v1 ResourceRequirements); default: sized from maxMemory.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True, "type": "object"},
    )

    @field_validator("max_memory")
    @classmethod
    def _max_memory(cls, value: str) -> str:
        size = quantity_bytes(value)
        if size is None or not MIN_STORE_BYTES <= size <= MAX_STORE_BYTES:
            raise ValueError(f"maxMemory={value!r} {_MEMORY_MESSAGE}")
        return value

    @property
    def max_memory_bytes(self) -> int:
        return quantity_bytes(self.max_memory) or MIN_STORE_BYTES


_BOTH = (
    "sharedState sets both url and rendered: it must be one of them, url (a store you run) or rendered (one the "
    "operator runs), e.g. rendered: {}"
)
_NEITHER = (
    "sharedState must be url (a store you run) or rendered (one the operator runs), e.g. url: "
    "redis://books.cache.svc:6379/0 or rendered: {}"
)
_CREDENTIALS = (
    "credentialsSecret must be set with url only (a rendered store has no password): drop it or set url, e.g. "
    "url: rediss://cache.example:6380/2"
)
_SHARED_STATE_CEL = cel(
    ("!(has(self.url) && has(self.rendered))", _BOTH),
    ("has(self.url) || has(self.rendered)", _NEITHER),
    ("!has(self.credentialsSecret) || has(self.url)", _CREDENTIALS),
)
_SHARED_STATE_CEL["x-kubernetes-validations"].append(
    {"rule": "!has(self.url) || !self.url.contains('@')", "message": CREDENTIALS_IN_URL, "fieldPath": ".url"}
)


class SharedStateSpec(Wire):
    """Where the pool's routers keep their shared books (docs/high-availability.md): exactly one of an
    external Redis-protocol store (url) or one the operator renders per pool (rendered)."""

    model_config = ConfigDict(json_schema_extra=_SHARED_STATE_CEL)

    url: Annotated[str, SHARED_STATE_URL] | None = Field(
        default=None,
        max_length=512,
        description="The store: redis://HOST[:PORT][/DB] or rediss:// (TLS), without credentials (credentialsSecret "
        "carries them). One store may serve many pools: keys are prefixed by the pool's uid.",
    )
    credentials_secret: StoreCredentials | None = Field(
        default=None, description="Secret with the store's ACL user and password (url only)."
    )
    rendered: RenderedStore | None = Field(
        default=None, description="Run a memory-only store for this pool instead (rendered: {} for the defaults)."
    )

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        if value is not None and "@" in value:
            raise ValueError(CREDENTIALS_IN_URL)  # a value_error: the refusal does not repeat the value
        return value

    @model_validator(mode="after")
    def _one_store(self) -> SharedStateSpec:
        if self.url is not None and self.rendered is not None:
            raise ValueError(_BOTH)
        if self.url is None and self.rendered is None:
            raise ValueError(_NEITHER)
        if self.credentials_secret is not None and self.url is None:
            raise ValueError(_CREDENTIALS)
        return self


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
    shared_state: SharedStateSpec | None = Field(
        default=None,
        description="One set of books for all the pool's routers (both doors; docs/high-availability.md): the "
        "requests each bound and holds, its demand on rate limits. Unset: each router keeps its own books.",
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
