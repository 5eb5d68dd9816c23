"""``spec.router``: the pool's front doors (HTTP router, gateway endpoint picker) and how requests wait. Pure.

``RouterSpec`` picks the scheduling policy and the door; ``GatewaySpec`` says how a Gateway
API Inference Extension gateway reaches the pool; ``DispatchSpec`` is the pool-level form of
the router's dispatch flags. Read by ``render`` (manifests, gateway) and the controller;
used by ``api.pool``; ``api.models`` re-exports the names.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, model_validator

from lorapool.api.common import DNS_SUBDOMAIN, FailureMode, FrontDoor, RouterPolicy, dns_label
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
