"""The gateway door of a pool (docs/gateway.md): its InferencePool, its endpoint picker Service and
the router pods' picker listener, and who may reach them. Pure.

A Gateway API Inference Extension gateway (Envoy Gateway, kgateway, Istio, GKE, ...) routes an
HTTPRoute's requests to an ``InferencePool``: it asks the pool's endpoint picker, per request and
over Envoy's ext_proc protocol, which engine pod serves it, then sends the request straight to that
pod's port. lorapool's picker is the router itself (``lorapool router --ext-proc-port``), so both
doors share one scheduler, one placement and one set of request windows; only the transport differs.
"""

from __future__ import annotations

from typing import Any

from lorapool.api.models import LoRAPool
from lorapool.render import names

Obj = dict[str, Any]

INFERENCE_POOL_API_VERSION = f"{names.INFERENCE_POOL_GROUP}/{names.INFERENCE_POOL_VERSION}"
_TLS_VOLUME = "epp-tls"


def inference_pool(pool: LoRAPool) -> Obj:
    """``InferencePool <pool>``: the pool's engine pods (only them), their vLLM port, and the picker.

    The selector is the engine Deployment's own, so a router pod or another pool's engine is never
    a member. ``port`` is the picker Service's port, as GIE requires for a Service reference.
    """
    p = pool.metadata.name
    gateway = pool.spec.router.gateway
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": names.metadata(pool.metadata.namespace, names.inference_pool(p), p, "engine"),
        "spec": {
            "selector": {"matchLabels": names.selector(p, "engine")},
            "targetPorts": [{"number": names.ENGINE_PORT}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": names.endpoint_picker(p),
                "port": {"number": names.EXT_PROC_PORT},
                "failureMode": gateway.failure_mode.value,
            },
        },
    }


def endpoint_picker_service(pool: LoRAPool) -> Obj:
    """``<pool>-epp``: the router pods' ext_proc (gRPC over TLS) and plaintext gRPC health ports.

    ``appProtocol`` says HTTP/2 on both (``http2`` on the picker port, as GIE's own picker Service
    has it; ``kubernetes.io/h2c`` on the plaintext health port) so gateways that read it (Istio)
    do not guess HTTP/1.1.
    """
    p = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.metadata(pool.metadata.namespace, names.endpoint_picker(p), p, "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(p, "router"),
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "port": names.EXT_PROC_PORT,
                    "targetPort": "grpc-ext-proc",
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
                {
                    "name": "grpc-health",
                    "port": names.EXT_PROC_HEALTH_PORT,
                    "targetPort": "grpc-health",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
            ],
        },
    }


def picker_args(pool: LoRAPool) -> list[str]:
    """The router's extra flags for the gateway door: the picker's listener, its health port, its TLS."""
    if not pool.spec.router.picker:
        return []
    args = ["--ext-proc-port", str(names.EXT_PROC_PORT), "--ext-proc-health-port", str(names.EXT_PROC_HEALTH_PORT)]
    if pool.spec.router.gateway.tls_secret_name:
        args += [
            "--ext-proc-tls-cert",
            f"{names.EXT_PROC_TLS_MOUNT}/tls.crt",
            "--ext-proc-tls-key",
            f"{names.EXT_PROC_TLS_MOUNT}/tls.key",
        ]
    if (timeout := pool.spec.router.gateway.message_timeout_seconds) is not None:
        args += ["--ext-proc-message-timeout", f"{timeout:g}"]
    # Without a Secret the picker makes a self-signed certificate in memory at start: TLS by default.
    return args


def picker_ports(pool: LoRAPool) -> list[Obj]:
    if not pool.spec.router.picker:
        return []
    return [
        {"name": "grpc-ext-proc", "containerPort": names.EXT_PROC_PORT, "protocol": "TCP"},
        {"name": "grpc-health", "containerPort": names.EXT_PROC_HEALTH_PORT, "protocol": "TCP"},
    ]


def picker_tls_mounts(pool: LoRAPool) -> tuple[list[Obj], list[Obj]]:
    """(volumes, volumeMounts) of the picker's certificate Secret; none when it self-signs."""
    secret = pool.spec.router.gateway.tls_secret_name
    if not pool.spec.router.picker or not secret:
        return [], []
    # 0444: the container runs as uid 1000 without an fsGroup, and the key is only ever in this container.
    volume = {"name": _TLS_VOLUME, "secret": {"secretName": secret, "defaultMode": 0o444}}
    mount = {"name": _TLS_VOLUME, "mountPath": names.EXT_PROC_TLS_MOUNT, "readOnly": True}
    return [volume], [mount]


def gateway_peers(pool: LoRAPool) -> list[Obj]:
    """NetworkPolicy peers of the gateway's data plane: its pods' namespace (and labels), its IP blocks."""
    gateway = pool.spec.router.gateway
    peers: list[Obj] = []
    if gateway.namespace:
        peer: Obj = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": gateway.namespace}}}
        if gateway.pod_labels:
            peer["podSelector"] = {"matchLabels": dict(gateway.pod_labels)}
        peers.append(peer)
    peers += [{"ipBlock": {"cidr": block}} for block in gateway.cidrs]
    return peers


def router_network_policy(pool: LoRAPool) -> Obj:
    """NetworkPolicy ``<pool>-router`` (gateway door only): the picker's ports from the gateway alone.

    The picker decides where a gateway sends requests, so only the gateway may ask it. The HTTP
    port stays open to every pod when the HTTP door is on (as without this policy); with the
    gateway door alone it carries only /metrics and probes, so only ``metricsNamespace`` reaches it
    (kubelet probes are always allowed).
    """
    p = pool.metadata.name
    http = {"port": names.ROUTER_PORT, "protocol": "TCP"}
    picker_ports = [
        {"port": names.EXT_PROC_PORT, "protocol": "TCP"},
        {"port": names.EXT_PROC_HEALTH_PORT, "protocol": "TCP"},
    ]
    ingress: list[Obj] = [{"from": gateway_peers(pool), "ports": picker_ports}]
    if pool.spec.router.http:
        ingress.append({"ports": [http]})
    elif scraper := pool.spec.security.metrics_namespace:
        ingress.append(
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": scraper}}}],
                "ports": [http],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": names.metadata(pool.metadata.namespace, names.router_network_policy(p), p, "router"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(p, "router")},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def gateway_objects(pool: LoRAPool) -> list[Obj]:
    """The gateway door's own objects, in apply order (the picker Service before the pool naming it)."""
    if not pool.spec.router.picker:
        return []
    policy = [router_network_policy(pool)] if pool.spec.security.network_policy else []
    return [*policy, endpoint_picker_service(pool), inference_pool(pool)]
