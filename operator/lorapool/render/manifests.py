"""Render a pool and its plan into the Kubernetes objects the operator applies. Pure.

``render_pool`` is what `lorapool render` prints and what the operator server-side
applies, object for object, so a GitOps review of the output is a review of the
cluster. Adapters change only the ``<pool>-adapters`` ConfigMap (the sidecars hot-load
them) and their priorities and limits only ``<pool>-traffic`` (the routers re-read it); the
engine pod template changes, and pods roll, only when vLLM's flags do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lorapool.api.adapterset import CONFIGMAP_KEY, AdapterSet, DesiredAdapter
from lorapool.api.models import DEFAULT_LORAPOOL_IMAGE, DispatchSpec, LoRAPool
from lorapool.api.report import SYNCED_CONDITION
from lorapool.api.traffic import TRAFFIC_CONFIGMAP_KEY, TrafficPolicy
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.gpus import GIB, GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL, GPU_RESOURCE, GPUS
from lorapool.plan.planner import Plan, pod_memory_bytes
from lorapool.render import gateway, names

Obj = dict[str, Any]


@dataclass(frozen=True)
class RenderOptions:
    """What the renderer needs beyond the pool: set by the operator from its own config."""

    lorapool_image: str = DEFAULT_LORAPOOL_IMAGE
    image_pull_policy: str = "IfNotPresent"


Holders = Mapping[str, Sequence[int]]  # adapter -> the replica slots placed to hold it


def render_pool(
    pool: LoRAPool,
    plan: Plan,
    adapters: Sequence[PoolAdapter],
    options: RenderOptions | None = None,
    holders: Holders | None = None,
) -> list[Obj]:
    """Every child object of ``pool``, in apply order.

    ``holders`` is the placement (``lorapool.plan.placement``) in replica slots; None while every
    replica holds every adapter (small pools, and offline renders without observed load).
    """
    opts = options or RenderOptions()
    objects = [
        adapters_configmap(pool, plan, adapters, holders),
        traffic_configmap(pool, adapters),
        engine_service(pool),
        engine_serviceaccount(pool),
        engine_role(pool),
        engine_rolebinding(pool),
        engine_deployment(pool, plan, adapters, opts),
        engine_pdb(pool),
        *([engine_network_policy(pool)] if pool.spec.security.network_policy else []),
        router_serviceaccount(pool),
        router_role(pool),
        router_rolebinding(pool),
        *([router_service(pool)] if pool.spec.router.http else []),
        router_deployment(pool, plan, opts),
        *gateway.gateway_objects(pool),  # the InferencePool and its picker (docs/gateway.md)
    ]
    return [_owned(pool, obj) for obj in objects]


def _meta(pool: LoRAPool, name: str, component: str) -> Obj:
    return names.metadata(pool.metadata.namespace, name, pool.metadata.name, component)


def _owned(pool: LoRAPool, obj: Obj) -> Obj:
    """ownerReferences to the pool when it exists in a cluster (offline renders have no uid)."""
    if pool.metadata.uid:
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": pool.api_version,
                "kind": "LoRAPool",
                "name": pool.metadata.name,
                "uid": pool.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return obj


def adapter_set(
    pool: LoRAPool, plan: Plan, adapters: Sequence[PoolAdapter], holders: Holders | None = None
) -> AdapterSet:
    """What the sidecars read: every adapter, with the slots that hold it when placement is on."""

    def slots(name: str) -> tuple[int, ...] | None:
        return None if holders is None else tuple(sorted(holders.get(name, ())))

    return AdapterSet(
        pool=pool.metadata.name,
        base_model=pool.spec.base_model.name,
        max_lora_rank=plan.max_lora_rank,
        adapters=tuple(
            DesiredAdapter(
                name=a.spec.name,
                source=a.spec.source,
                revision=a.spec.revision,
                sha256=a.spec.sha256,
                rank=a.spec.rank,
                replicas=slots(a.spec.name),
            )
            for a in adapters
        ),
    )


def adapters_configmap(
    pool: LoRAPool, plan: Plan, adapters: Sequence[PoolAdapter], holders: Holders | None = None
) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, names.adapters_configmap(pool.metadata.name), "adapters"),
        "data": {CONFIGMAP_KEY: adapter_set(pool, plan, adapters, holders).to_json()},
    }


def traffic_policy(pool: LoRAPool, adapters: Sequence[PoolAdapter]) -> TrafficPolicy:
    """What the routers enforce: the adapters that set ``traffic`` (the rest get the defaults), and
    how many routers share each limit."""
    return TrafficPolicy(
        pool=pool.metadata.name,
        routers=max(1, pool.spec.router.replicas),
        adapters={a.spec.name: a.spec.traffic for a in adapters if a.spec.traffic is not None},
    )


def traffic_configmap(pool: LoRAPool, adapters: Sequence[PoolAdapter]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, names.traffic_configmap(pool.metadata.name), "traffic"),
        "data": {TRAFFIC_CONFIGMAP_KEY: traffic_policy(pool, adapters).to_json()},
    }


def engine_args(pool: LoRAPool, plan: Plan) -> list[str]:
    """`vllm serve` arguments; every flag is one vLLM's own parser accepts."""
    spec = pool.spec
    args = [
        _model_arg(pool),
        "--served-model-name",
        spec.base_model.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(names.ENGINE_PORT),
        "--dtype",
        spec.base_model.dtype.value,
        "--max-model-len",
        str(plan.max_model_len),
        "--gpu-memory-utilization",
        str(spec.vllm.gpu_memory_utilization),
        "--tensor-parallel-size",
        str(plan.tensor_parallel_size),
        "--max-num-seqs",
        str(spec.vllm.max_num_seqs),
        "--enable-lora",
        "--max-loras",
        str(plan.max_loras),
        "--max-lora-rank",
        str(plan.max_lora_rank),
        "--max-cpu-loras",
        str(plan.max_cpu_loras),
        "--lora-dtype",
        spec.lora.dtype.value,
    ]
    if spec.lora.target_modules:
        args += ["--lora-target-modules", *spec.lora.target_modules]
    if spec.base_model.revision:
        args += ["--revision", spec.base_model.revision]
    if spec.base_model.source.startswith("s3://"):
        args += ["--load-format", "runai_streamer"]
    return args + list(spec.vllm.extra_args)


def _model_arg(pool: LoRAPool) -> str:
    source = pool.spec.base_model.source
    if source.startswith("hf://"):
        return source.removeprefix("hf://")
    if source.startswith("pvc://"):
        _, _, path = source.removeprefix("pvc://").partition("/")
        return f"{names.MODELS_MOUNT}/base/{path}".rstrip("/")
    if source.startswith("file://"):
        return source.removeprefix("file://")
    return source  # s3://, streamed by vLLM's runai_streamer load format


def _credentials_env(pool: LoRAPool, *, hf: bool, s3: bool) -> list[Obj]:
    creds = pool.spec.credentials
    env: list[Obj] = []
    if creds is None:
        return env
    if hf and creds.hugging_face:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": creds.hugging_face.name, "key": creds.hugging_face.key}},
            }
        )
    if s3 and creds.s3:
        if creds.s3.secret_name:
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": creds.s3.secret_name, "key": key}}})
        if creds.s3.endpoint:
            env.append({"name": "AWS_ENDPOINT_URL", "value": creds.s3.endpoint})
        if creds.s3.region:
            env.append({"name": "AWS_REGION", "value": creds.s3.region})
    return env


def _own_pod_env() -> list[Obj]:
    """POD_NAME / POD_NAMESPACE from the downward API: the Pod a container writes its status on
    (``lorapool.podstatus.PodRef.from_env``)."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def _api_key_env(pool: LoRAPool) -> list[Obj]:
    """The engines' API key from its Secret: vLLM requires it, the router and the sidecar send it."""
    ref = pool.spec.security.api_key_secret_ref
    if ref is None:
        return []
    return [{"name": names.ENGINE_API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def _restricted(read_only_root: bool) -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _node_placement(pool: LoRAPool) -> Obj:
    gpu = pool.spec.gpu
    placement: Obj = {}
    if gpu.node_selector is not None:
        placement["nodeSelector"] = dict(gpu.node_selector)
    else:
        placement["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": GPU_PRODUCT_LABEL,
                                    "operator": "In",
                                    "values": list(GPUS[gpu.product].node_products),
                                }
                            ]
                        }
                    ]
                }
            }
        }
    if gpu.tolerations is not None:
        placement["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in gpu.tolerations]
    else:
        placement["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return placement


def _engine_resources(pool: LoRAPool, plan: Plan) -> Obj:
    spec = pool.spec
    given = json.loads(json.dumps(spec.vllm.resources or {}))
    memory = f"{pod_memory_bytes(spec, plan.memory.weights_bytes * plan.tensor_parallel_size) // GIB}Gi"
    requests = {"cpu": str(4 * spec.gpu.count), "memory": memory, **(given.get("requests") or {})}
    limits = {"memory": memory, **(given.get("limits") or {})}
    gpus = str(spec.gpu.count)
    requests[GPU_RESOURCE] = gpus
    limits[GPU_RESOURCE] = gpus
    return {"requests": requests, "limits": limits}


def config_hash(template: Obj) -> str:
    """Stable hash of a pod template; changes exactly when the pods must be replaced."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def engine_deployment(pool: LoRAPool, plan: Plan, adapters: Sequence[PoolAdapter], opts: RenderOptions) -> Obj:
    """Deployment ``<pool>-engine``: vLLM plus the adapter-sync sidecar; pods roll only when the template hash moves."""
    p = pool.metadata.name
    volumes = _engine_volumes(pool, adapters)
    pvc_mounts = [
        {"name": v["name"], "mountPath": f"/mnt/pvc/{v['name'].removeprefix('pvc-')}", "readOnly": True}
        for v in volumes
        if v["name"].startswith("pvc-")
    ]
    pod_spec: Obj = {
        "enableServiceLinks": False,  # a Service named "vllm" would inject VLLM_PORT and break vLLM
        # No token for vLLM: the sidecar alone gets one, projected into its container (report-token).
        "serviceAccountName": names.engine_service_account(p),
        "automountServiceAccountToken": False,
        # The pod joins the Service once its sidecar says the first adapter sync is over (loaded or
        # failed: a broken adapter fails everywhere alike and keeps no pod out); see docs/status.md.
        "readinessGates": [{"conditionType": SYNCED_CONDITION}],
        "terminationGracePeriodSeconds": 60,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        **_node_placement(pool),
        "containers": [_vllm_container(pool, plan, opts, pvc_mounts), _sidecar_container(pool, opts, pvc_mounts)],
        "volumes": volumes,
    }
    template: Obj = {"metadata": {"labels": names.labels(p, "engine")}, "spec": pod_spec}
    template["metadata"]["annotations"] = {names.CONFIG_HASH_ANNOTATION: config_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, names.engine(p), "engine"),
        "spec": {
            "replicas": pool.spec.replicas,
            "selector": {"matchLabels": names.selector(p, "engine")},
            # GPUs are scarce: replace pods in place instead of surging onto GPUs that may not exist.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": template,
        },
    }


def _pvc_claim(source: str) -> str:
    return source.removeprefix("pvc://").split("/", 1)[0]


def _engine_volumes(pool: LoRAPool, adapters: Sequence[PoolAdapter]) -> list[Obj]:
    """Shared memory, the adapter dir and its config, model caches, and one volume per PVC a source names."""
    spec = pool.spec
    volumes: list[Obj] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{8 * spec.gpu.count}Gi"}},
        {"name": "adapters", "emptyDir": {}},
        {"name": "adapters-config", "configMap": {"name": names.adapters_configmap(pool.metadata.name)}},
        {"name": "models", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        _report_token_volume(),
        _podinfo_volume(),
    ]
    if spec.base_model.source.startswith("pvc://"):
        claim = _pvc_claim(spec.base_model.source)
        volumes.append({"name": "base-model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    for adapter in adapters:
        if adapter.spec.source.startswith("pvc://"):
            claim = _pvc_claim(adapter.spec.source)
            if not any(v["name"] == f"pvc-{claim}" for v in volumes):
                volumes.append(
                    {"name": f"pvc-{claim}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                )
    return volumes


def _podinfo_volume() -> Obj:
    """The pod's placement slot as a file the kubelet refreshes when the operator sets the annotation
    (empty until then); mounted into the sidecar only."""
    field = f"metadata.annotations['{names.SLOT_ANNOTATION}']"
    return {"name": "podinfo", "downwardAPI": {"items": [{"path": names.SLOT_FILE, "fieldRef": {"fieldPath": field}}]}}


def _report_token_volume() -> Obj:
    """The ServiceAccount token (rotated by the kubelet), the cluster CA and the namespace, as the
    default token mount has them; mounted into the sidecar only."""
    return {
        "name": "report-token",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }


def _vllm_container(pool: LoRAPool, plan: Plan, opts: RenderOptions, pvc_mounts: list[Obj]) -> Obj:
    spec = pool.spec
    model_mounts: list[Obj] = [{"name": "models", "mountPath": names.MODELS_MOUNT}]
    if spec.base_model.source.startswith("pvc://"):
        model_mounts.append({"name": "base-model", "mountPath": f"{names.MODELS_MOUNT}/base", "readOnly": True})
    env = [
        {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"},
        {"name": "HF_HOME", "value": f"{names.MODELS_MOUNT}/hf"},
        {"name": "HOME", "value": "/tmp"},
        *_api_key_env(pool),
        *_credentials_env(pool, hf=True, s3=True),
        *[e.model_dump(by_alias=True, exclude_none=True) for e in spec.vllm.env],
    ]
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        "name": "vllm",
        "image": spec.vllm.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": ["vllm", "serve"],
        "args": engine_args(pool, plan),
        "env": env,
        "ports": [{"name": "http", "containerPort": names.ENGINE_PORT, "protocol": "TCP"}],
        "resources": _engine_resources(pool, plan),
        "startupProbe": {**probe, "periodSeconds": 10, "failureThreshold": 180, "timeoutSeconds": 5},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "adapters", "mountPath": names.ADAPTERS_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            *model_mounts,
            *pvc_mounts,
        ],
        # vLLM compiles kernels into ~/.cache and /tmp, so its root filesystem stays writable.
        "securityContext": _restricted(read_only_root=False),
    }


def _sidecar_container(pool: LoRAPool, opts: RenderOptions, pvc_mounts: list[Obj]) -> Obj:
    spec = pool.spec
    args = [
        "sidecar",
        "--config",
        f"{names.ADAPTERS_CONFIG_MOUNT}/{CONFIGMAP_KEY}",
        "--engine",
        f"http://127.0.0.1:{names.ENGINE_PORT}",
        "--adapter-dir",
        names.ADAPTERS_MOUNT,
        "--host",
        "0.0.0.0",
        "--status-port",
        str(names.SIDECAR_STATUS_PORT),
        "--slot-file",
        f"{names.PODINFO_MOUNT}/{names.SLOT_FILE}",
    ]
    return {
        "name": "adapter-sync",
        "image": spec.sidecar.image or opts.lorapool_image,
        "imagePullPolicy": opts.image_pull_policy,
        "args": args,
        "env": [
            {"name": "HF_HOME", "value": "/tmp/hf"},
            *_own_pod_env(),  # the Pod it reports on (lorapool.api.report)
            *_api_key_env(pool),
            *_credentials_env(pool, hf=True, s3=True),
        ],
        "ports": [{"name": "sidecar", "containerPort": names.SIDECAR_STATUS_PORT, "protocol": "TCP"}],
        "resources": spec.sidecar.resources
        or {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "sidecar"}, "periodSeconds": 10},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "sidecar"},
            "periodSeconds": 20,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "adapters", "mountPath": names.ADAPTERS_MOUNT},
            # Mounted without subPath so ConfigMap updates reach the running sidecar.
            {"name": "adapters-config", "mountPath": names.ADAPTERS_CONFIG_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "report-token", "mountPath": names.SERVICE_ACCOUNT_MOUNT, "readOnly": True},
            {"name": "podinfo", "mountPath": names.PODINFO_MOUNT, "readOnly": True},
            *pvc_mounts,
        ],
        "securityContext": _restricted(read_only_root=True),
    }


def engine_service(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, names.engine_service(p), "engine"),
        "spec": {
            "clusterIP": "None",  # headless: the router discovers pods through its EndpointSlices
            "selector": names.selector(p, "engine"),
            "ports": [
                {"name": "http", "port": names.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "sidecar", "port": names.SIDECAR_STATUS_PORT, "targetPort": "sidecar", "protocol": "TCP"},
            ],
        },
    }


def engine_pdb(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(pool, names.engine(p), "engine"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(p, "engine")}},
    }


def engine_serviceaccount(pool: LoRAPool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(pool, names.engine_service_account(pool.metadata.name), "engine"),
        "automountServiceAccountToken": False,  # the pod template projects the token into the sidecar only
    }


def engine_role(pool: LoRAPool) -> Obj:
    """The sidecars' only right: patch the status (report annotation and condition) of pods in the namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(pool, names.engine_service_account(pool.metadata.name), "engine"),
        "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}],
    }


def _own_binding(pool: LoRAPool, name: str, component: str) -> Obj:
    """The RoleBinding of a component's Role to its ServiceAccount (all three share ``name``)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(pool, name, component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.metadata.namespace}],
    }


def engine_rolebinding(pool: LoRAPool) -> Obj:
    return _own_binding(pool, names.engine_service_account(pool.metadata.name), "engine")


def router_serviceaccount(pool: LoRAPool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(pool, names.router(pool.metadata.name), "router"),
        "automountServiceAccountToken": True,
    }


def router_role(pool: LoRAPool) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(pool, names.router(pool.metadata.name), "router"),
        "rules": [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            # The engine pods' sidecar reports (docs/status.md): the router routes by them.
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            # Its request counts per adapter on its own Pod (lorapool.io/requests, docs/placement.md).
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        ],
    }


def router_rolebinding(pool: LoRAPool) -> Obj:
    return _own_binding(pool, names.router(pool.metadata.name), "router")


def router_service(pool: LoRAPool) -> Obj:
    p = pool.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, names.router_service(p), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(p, "router"),
            "ports": [{"name": "http", "port": names.ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


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
        "metadata": _meta(pool, names.engine_network_policy(p), "engine"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(p, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _off_gpu_nodes() -> Obj:
    """Prefer nodes without GPUs: a router on a GPU node takes CPU and memory the engines' pods need.

    Preferred, not required, so a cluster made only of GPU nodes still runs its routers.
    """
    no_gpu = [{"key": label, "operator": "DoesNotExist"} for label in (GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL)]
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": no_gpu}}
            ]
        }
    }


def _router_args(pool: LoRAPool, plan: Plan) -> list[str]:
    """The router's command line: where it finds engines and their reports, its policy, the plan's capacity.

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
        "--policy",
        pool.spec.router.policy.value,
        # The engines' LoRA capacity, known before vLLM reports it after its first step.
        "--max-loras",
        str(plan.max_loras),
        "--max-cpu-loras",
        str(plan.max_cpu_loras),
        # Priorities and rate limits (<pool>-traffic), re-read when the ConfigMap changes.
        "--traffic-file",
        f"{names.TRAFFIC_MOUNT}/{TRAFFIC_CONFIGMAP_KEY}",
        # Fair dispatch and the saturation caps, when the pool asks for them.
        *_dispatch_args(pool.spec.router.dispatch),
        # Prefix locality among an adapter's holders, when the pool asks for it.
        *(["--prefix-weight", f"{pool.spec.router.prefix_weight:g}"] if pool.spec.router.prefix_weight > 0 else []),
    ]


def _dispatch_args(dispatch: DispatchSpec) -> list[str]:
    """The router's flags for spec.router.dispatch; none for its defaults."""
    args = ["--fair-dispatch"] if dispatch.fair else []
    if dispatch.max_prefilling is not None:
        args += ["--max-prefilling", str(dispatch.max_prefilling)]
    if dispatch.max_inflight is not None:
        args += ["--max-inflight", str(dispatch.max_inflight)]
    if dispatch.max_prefilling is not None or dispatch.max_inflight is not None:
        args += ["--max-queue-wait", f"{dispatch.max_queue_wait_seconds:g}"]
    return args


def router_deployment(pool: LoRAPool, plan: Plan, opts: RenderOptions) -> Obj:
    p = pool.metadata.name
    router = pool.spec.router
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container: Obj = {
        "name": "router",
        "image": router.image or opts.lorapool_image,
        "imagePullPolicy": opts.image_pull_policy,
        "args": [*_router_args(pool, plan), *gateway.picker_args(pool)],
        "env": [
            *_own_pod_env(),  # the Pod it writes its request counts on (lorapool.api.requests)
            *_api_key_env(pool),
        ],
        "ports": [{"name": "http", "containerPort": names.ROUTER_PORT, "protocol": "TCP"}, *gateway.picker_ports(pool)],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "securityContext": _restricted(read_only_root=True),
    }
    volumes, mounts = gateway.picker_tls_mounts(pool)
    # Mounted without subPath so ConfigMap updates reach the running router.
    volumes = [{"name": "traffic", "configMap": {"name": names.traffic_configmap(p)}}, *volumes]
    container["volumeMounts"] = [{"name": "traffic", "mountPath": names.TRAFFIC_MOUNT, "readOnly": True}, *mounts]
    pod: Obj = {
        "serviceAccountName": names.router(p),
        "enableServiceLinks": False,
        "affinity": _off_gpu_nodes(),
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, names.router(p), "router"),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": names.selector(p, "router")},
            "template": {
                "metadata": {"labels": names.labels(p, "router")},
                "spec": pod,
            },
        },
    }
