"""Every Kubernetes object name and label lorapool uses, derived from the pool. Pure.

One module owns names so the renderer, the operator, the router and the tests agree.
"""

from __future__ import annotations

from lorapool.api.adapterset import MAX_SHARDS as MAX_ADAPTER_SHARDS
from lorapool.api.pods import POD_DELETION_COST_ANNOTATION as POD_DELETION_COST_ANNOTATION
from lorapool.api.pods import SLOT_ANNOTATION as SLOT_ANNOTATION

ENGINE_PORT = 8000
SIDECAR_STATUS_PORT = 8081
ROUTER_PORT = 8000
# The endpoint picker (the router pods' gRPC ext_proc listener, docs/gateway.md): GIE's ports.
EXT_PROC_PORT = 9002
EXT_PROC_HEALTH_PORT = 9003
EXT_PROC_TLS_MOUNT = "/etc/lorapool/epp-tls"
INFERENCE_POOL_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_VERSION = "v1"
CONFIG_HASH_ANNOTATION = "lorapool.io/config-hash"
POOL_LABEL = "lorapool.io/pool"
FIELD_MANAGER = "lorapool-operator"
ADAPTERS_MOUNT = "/adapters"
MODELS_MOUNT = "/models"
# Where the router reads ``<pool>-traffic`` (a directory mount, so ConfigMap updates reach it).
TRAFFIC_MOUNT = "/etc/lorapool/traffic"
# Where the router reads ``<pool>-router-policy`` (a directory mount too, re-read live).
ROUTER_POLICY_MOUNT = "/etc/lorapool/router-policy"
# Placement (docs/placement.md): the operator gives each engine pod a stable slot (0..replicas-1)
# in this annotation; the sidecar reads it through a downward-API file; the deletion cost makes a
# scale-down remove the highest slot, so only that slot's adapters move. Both keys are defined
# beside the reader of engine pods (``lorapool.api.pods``) and named here with the rest.
PODINFO_MOUNT = "/etc/podinfo"
SLOT_FILE = "slot"
# Where the sidecar (only) finds its projected ServiceAccount token, as in-cluster clients expect it.
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The engines' API key: vLLM reads this variable as its --api-key; the router and the sidecar send it.
ENGINE_API_KEY_ENV = "VLLM_API_KEY"


def engine(pool: str) -> str:
    return f"{pool}-engine"


def engine_service(pool: str) -> str:
    return f"{pool}-engine"


def engine_network_policy(pool: str) -> str:
    return f"{pool}-engine"


def engine_service_account(pool: str) -> str:
    """The engine pods' ServiceAccount: its token is projected into the sidecar only, to report on its Pod."""
    return f"{pool}-engine"


def router(pool: str) -> str:
    return f"{pool}-router"


def router_service(pool: str) -> str:
    return pool


def endpoint_picker(pool: str) -> str:
    """The picker's Service (gRPC and health ports of the router pods), as the InferencePool names it."""
    return f"{pool}-epp"


def inference_pool(pool: str) -> str:
    return pool


def router_network_policy(pool: str) -> str:
    return f"{pool}-router"


def books_store(pool: str) -> str:
    """The rendered shared-books store's Deployment, Service and NetworkPolicy (spec.router.sharedState.rendered)."""
    return f"{pool}-books"


def adapters_configmap(pool: str) -> str:
    return f"{pool}-adapters"


def adapter_shard(pool: str, index: int) -> str:
    """Shard ``index`` of a large adapter set (``lorapool.api.adapterset``), named by the index ConfigMap."""
    return f"{pool}-adapters-{index}"


def adapter_shards(pool: str) -> list[str]:
    """Every shard slot a pool can use: a fixed list, so the sidecars' Role names them all once."""
    return [adapter_shard(pool, i) for i in range(MAX_ADAPTER_SHARDS)]


def traffic_configmap(pool: str) -> str:
    """Every adapter's priority and rate limits, for the routers (``api.traffic``)."""
    return f"{pool}-traffic"


def router_policy_configmap(pool: str) -> str:
    """The routers' policy document (``api.routerpolicy``): profiles, weights, plugin parameters."""
    return f"{pool}-router-policy"


def labels(pool: str, component: str) -> dict[str, str]:
    """Recommended app.kubernetes.io labels plus the pool label the operator watches by."""
    return {
        "app.kubernetes.io/name": "lorapool",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "lorapool",
        "app.kubernetes.io/managed-by": "lorapool-operator",
        POOL_LABEL: pool,
    }


def metadata(namespace: str, name: str, pool: str, component: str) -> dict[str, object]:
    """A child object's metadata: its name, the pool's namespace, the component's labels."""
    return {"name": name, "namespace": namespace, "labels": labels(pool, component)}


def selector(pool: str, component: str) -> dict[str, str]:
    """The immutable subset of labels used by Deployment selectors and Services."""
    return {"app.kubernetes.io/instance": pool, "app.kubernetes.io/component": component, POOL_LABEL: pool}


def selector_string(pool: str, component: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(pool, component).items())


def endpoint(pool: str, namespace: str) -> str:
    return f"http://{router_service(pool)}.{namespace}.svc:{ROUTER_PORT}/v1"
