"""The router Deployment ``<pool>-router``: its command line (where it finds the engines and their
reports, its policy document, its traffic document, its shared books' store) and its pod, off the GPU
nodes and spread over nodes. Pure.

Nothing the planner derives or ``spec.router`` tunes (policy, prefixWeight, dispatch, the plan's
maxLoras/maxCpuLoras) is on the command line: it is all in the policy document
(``render.configmaps.router_policy``), which the routers re-read live, so none of it rolls them.
``spec.router.sharedState`` is process plumbing (which store to connect to, ``render.books``): a
change of it rolls the routers, as it must (a connection is made at start).

Called by ``lorapool.render.manifests.render_pool``. With the gateway door the same pods also
serve the endpoint picker (``lorapool.render.gateway`` adds its flags, ports and TLS volume).
"""

from __future__ import annotations

from lorapool.api.models import LoRAPool
from lorapool.api.routerpolicy import ROUTER_POLICY_CONFIGMAP_KEY
from lorapool.api.traffic import TRAFFIC_CONFIGMAP_KEY
from lorapool.plan.gpus import GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL
from lorapool.render import books, gateway, names
from lorapool.render.common import Obj, RenderOptions, api_key_env, meta, own_pod_env, restricted

HOSTNAME_LABEL = "kubernetes.io/hostname"


def _affinity(pool: LoRAPool) -> Obj:
    """Prefer nodes without GPUs: a router on a GPU node takes CPU and memory the engines' pods need.
    Prefer the routers on different nodes too (one node lost is one router lost).

    Preferred, not required, so a cluster made only of GPU nodes, or of one node, still runs its routers.
    The scheduler weighs spreading (this and ``_spread``) above the GPU-free preference: with one GPU-free
    node the second router goes to a GPU node. Rendered whatever the replica count, so scaling the
    routers never changes their pod template (a roll).
    """
    no_gpu = [{"key": label, "operator": "DoesNotExist"} for label in (GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL)]
    apart = {"labelSelector": {"matchLabels": names.selector(pool.metadata.name, "router")}}
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": no_gpu}}
            ]
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": {**apart, "topologyKey": HOSTNAME_LABEL}}
            ]
        },
    }


def _spread(pool: LoRAPool) -> list[Obj]:
    """Spread the routers over nodes (ScheduleAnyway: a small cluster still runs them all); a no-op for one."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME_LABEL,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": names.selector(pool.metadata.name, "router")},
        }
    ]


def _router_args(pool: LoRAPool) -> list[str]:
    """The router's command line: where it finds engines and their reports, its policy and traffic documents.

    Apart from the Deployment because it is what ties the router to the pool; the rest is pod plumbing."""
    p = pool.metadata.name
    ns = pool.metadata.namespace
    return [
        "router",
        "--host",
        "0.0.0.0",
        "--port",
        str(names.ROUTER_PORT),
        "--endpointslices",
        f"{ns}/{names.engine_service(p)}",
        # Route by what each engine's sidecar reports it holds (loaded, loading, failed).
        "--report-pods",
        f"{ns}/{names.selector_string(p, 'engine')}",
        # The adapters the pool has: one it names is held while it loads, never a 404 (docs/status.md).
        "--adapters-configmap",
        f"{ns}/{names.adapters_configmap(p)}",
        # The policy document (<pool>-router-policy: spec.router's policy, prefixWeight and dispatch, the
        # plan's maxLoras and maxCpuLoras), re-read live.
        "--policy-file",
        f"{names.ROUTER_POLICY_MOUNT}/{ROUTER_POLICY_CONFIGMAP_KEY}",
        # Priorities and rate limits (<pool>-traffic), re-read when the ConfigMap changes.
        "--traffic-file",
        f"{names.TRAFFIC_MOUNT}/{TRAFFIC_CONFIGMAP_KEY}",
    ]


def router_deployment(pool: LoRAPool, opts: RenderOptions) -> Obj:
    """Deployment ``<pool>-router``: the router container, the traffic file it re-reads, its pod off the GPU
    nodes and spread over nodes (with several, ``render.policies.router_pdb`` keeps one down at a time)."""
    p = pool.metadata.name
    router = pool.spec.router
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container: Obj = {
        "name": "router",
        "image": router.image or opts.lorapool_image,
        "imagePullPolicy": opts.image_pull_policy,
        "args": [*_router_args(pool), *gateway.picker_args(pool), *books.router_args(pool)],
        "env": [
            *own_pod_env(),  # the Pod it writes its request counts on (lorapool.api.requests)
            *api_key_env(pool),
            *books.router_env(pool),  # the shared store's credentials (docs/high-availability.md)
        ],
        "ports": [{"name": "http", "containerPort": names.ROUTER_PORT, "protocol": "TCP"}, *gateway.picker_ports(pool)],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "securityContext": restricted(read_only_root=True),
    }
    volumes, mounts = gateway.picker_tls_mounts(pool)
    # Mounted without subPath so ConfigMap updates reach the running router.
    volumes = [
        {"name": "traffic", "configMap": {"name": names.traffic_configmap(p)}},
        {"name": "router-policy", "configMap": {"name": names.router_policy_configmap(p)}},
        *volumes,
    ]
    container["volumeMounts"] = [
        {"name": "traffic", "mountPath": names.TRAFFIC_MOUNT, "readOnly": True},
        {"name": "router-policy", "mountPath": names.ROUTER_POLICY_MOUNT, "readOnly": True},
        *mounts,
    ]
    pod: Obj = {
        "serviceAccountName": names.router(p),
        "enableServiceLinks": False,
        "affinity": _affinity(pool),
        "topologySpreadConstraints": _spread(pool),
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(pool, names.router(p), "router"),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": names.selector(p, "router")},
            "template": {
                "metadata": {"labels": names.labels(p, "router")},
                "spec": pod,
            },
        },
    }
