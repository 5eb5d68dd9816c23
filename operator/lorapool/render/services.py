"""The pool's two Services: the engines' headless ``<pool>-engine`` (the routers discover the
engine pods through its EndpointSlices) and the router's ``<pool>`` (the pool's one OpenAI
endpoint, with the router front door). Pure.

Called by ``lorapool.render.manifests.render_pool``. The gateway door's picker Service lives in
``lorapool.render.gateway``.
"""

from __future__ import annotations

from lorapool.api.models import LoRAPool
from lorapool.render import names
from lorapool.render.common import Obj, meta


def engine_service(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(pool, names.engine_service(p), "engine"),
        "spec": {
            "clusterIP": "None",  # headless: the router discovers pods through its EndpointSlices
            "selector": names.selector(p, "engine"),
            "ports": [
                {"name": "http", "port": names.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "sidecar", "port": names.SIDECAR_STATUS_PORT, "targetPort": "sidecar", "protocol": "TCP"},
            ],
        },
    }


def router_service(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(pool, names.router_service(p), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(p, "router"),
            "ports": [{"name": "http", "port": names.ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
