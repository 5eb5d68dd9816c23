"""The policies that guard the engine pods: their PodDisruptionBudget (one pod down at a time) and
their NetworkPolicy (only the pool's routers, and the gateway's data plane, reach vLLM); and the
routers' PodDisruptionBudget when there are several. Pure.

Called by ``lorapool.render.manifests.render_pool``; the NetworkPolicy only with
``spec.security.networkPolicy``.
"""

from __future__ import annotations

from lorapool.api.models import LoRAPool
from lorapool.render import gateway, names
from lorapool.render.common import Obj, meta


def engine_pdb(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(pool, names.engine(p), "engine"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(p, "engine")}},
    }


def router_pdb(pool: LoRAPool) -> list[Obj]:
    """PodDisruptionBudget ``<pool>-router`` with several routers: a drain takes one at a time, so the
    others serve on (and, with ``sharedState``, keep the books). None for one router: one unavailable
    of one guards nothing, and a stricter budget would block every drain of its node."""
    p = pool.metadata.name
    if pool.spec.router.replicas <= 1:
        return []
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta(pool, names.router(p), "router"),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(p, "router")}},
        }
    ]


def engine_network_policy(pool: LoRAPool) -> Obj:
    """NetworkPolicy ``<pool>-engine``: only this pool's router pods (and, with the gateway door, the
    gateway's data-plane pods or IP blocks of ``spec.router.gateway``) reach the engines' port 8000.

    That port carries vLLM's runtime LoRA API (load any path, unload everything), so no other
    pod may call it. The sidecar calls its engine over localhost, which a NetworkPolicy does not
    filter, and kubelet probes from the node are always allowed. ``spec.security.metricsNamespace``
    adds a scraper namespace to the engine and sidecar metrics ports.
    """
    p = pool.metadata.name
    engine_port = {"port": names.ENGINE_PORT, "protocol": "TCP"}
    routers: list[Obj] = [{"podSelector": {"matchLabels": names.selector(p, "router")}}]
    # The gateway door: the gateway's data plane sends each request straight to the engine pod
    # its picker chose (docs/gateway.md says which HTTPRoute keeps the LoRA API out of reach).
    peers = gateway.gateway_peers(pool) if pool.spec.router.picker else []
    ingress: list[Obj] = [{"from": [*routers, *peers], "ports": [engine_port]}]
    if scraper := pool.spec.security.metrics_namespace:
        ingress.append(
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": scraper}}}],
                "ports": [engine_port, {"port": names.SIDECAR_STATUS_PORT, "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(pool, names.engine_network_policy(p), "engine"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(p, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
