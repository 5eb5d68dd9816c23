"""The engine Deployment ``<pool>-engine``: its pod template (vLLM plus the adapter-sync sidecar),
vLLM's arguments, resources and node placement, and the pod's volumes. Pure.

Called by ``lorapool.render.manifests.render_pool``. The template's hash is its annotation, so
pods roll exactly when the template changes: when vLLM's flags do, never when adapters do (they
live in ``<pool>-adapters`` and its shards, ``lorapool.render.configmaps``, which the sidecar reads
through the API: no volume names them, so no change of the set or of its shard count touches the template).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from lorapool.api.models import LoRAPool
from lorapool.api.report import SYNCED_CONDITION
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.gpus import GIB, GPU_PRODUCT_LABEL, GPU_RESOURCE, GPUS
from lorapool.plan.planner import Plan, pod_memory_bytes
from lorapool.render import names
from lorapool.render.common import Obj, RenderOptions, api_key_env, meta, restricted
from lorapool.render.sidecar import podinfo_volume, report_token_volume, sidecar_container
from lorapool.render.source_access import (
    adapter_source_volumes,
    base_model_mounts,
    base_model_volumes,
    credentials_env,
    load_format_args,
    model_arg,
)

# A stopping engine pod: the kubelet runs the vLLM container's preStop sleep first, while the
# EndpointSlice controller takes the pod out of the engine Service and the routers stop sending to
# it; then vLLM gets SIGTERM and drains (--shutdown-timeout: requests in flight finish, new ones are
# refused) for up to DRAIN_S. The grace period covers both, with room for the sidecar's own stop.
ENDPOINTS_SETTLE_S = 5
DRAIN_S = 30
TERMINATION_GRACE_S = 60


def engine_args(pool: LoRAPool, plan: Plan) -> list[str]:
    """`vllm serve` arguments; every flag is one vLLM's own parser accepts."""
    spec = pool.spec
    args = [
        model_arg(pool),
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
        "--shutdown-timeout",  # drain on SIGTERM (vLLM's default, 0, aborts what is in flight)
        str(DRAIN_S),
    ]
    if spec.lora.target_modules:
        args += ["--lora-target-modules", *spec.lora.target_modules]
    if spec.base_model.revision:
        args += ["--revision", spec.base_model.revision]
    args += load_format_args(pool)
    return args + list(spec.vllm.extra_args)


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
    sources = adapter_source_volumes(adapters)
    source_mounts = [mount for _, mount in sources]
    pod_spec: Obj = {
        "enableServiceLinks": False,  # a Service named "vllm" would inject VLLM_PORT and break vLLM
        # No token for vLLM: the sidecar alone gets one, projected into its container (report-token).
        "serviceAccountName": names.engine_service_account(p),
        "automountServiceAccountToken": False,
        # The pod joins the Service once its sidecar says the first adapter sync is over (loaded or
        # failed: a broken adapter fails everywhere alike and keeps no pod out); see docs/status.md.
        "readinessGates": [{"conditionType": SYNCED_CONDITION}],
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        **_node_placement(pool),
        "containers": [
            _vllm_container(pool, plan, opts, source_mounts),
            sidecar_container(pool, opts, source_mounts),
        ],
        "volumes": [*_engine_volumes(pool), *(volume for volume, _ in sources)],
    }
    template: Obj = {"metadata": {"labels": names.labels(p, "engine")}, "spec": pod_spec}
    template["metadata"]["annotations"] = {names.CONFIG_HASH_ANNOTATION: config_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(pool, names.engine(p), "engine"),
        "spec": {
            "replicas": pool.spec.replicas,
            "selector": {"matchLabels": names.selector(p, "engine")},
            # GPUs are scarce: replace pods in place instead of surging onto GPUs that may not exist.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": template,
        },
    }


def _engine_volumes(pool: LoRAPool) -> list[Obj]:
    """Shared memory, the adapter dir, model caches, the sidecar's two, and a mounted base model's
    (the adapters' mounted sources follow them)."""
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{8 * pool.spec.gpu.count}Gi"}},
        {"name": "adapters", "emptyDir": {}},
        {"name": "models", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        report_token_volume(),
        podinfo_volume(),
        *base_model_volumes(pool),
    ]


def _vllm_container(pool: LoRAPool, plan: Plan, opts: RenderOptions, source_mounts: list[Obj]) -> Obj:
    spec = pool.spec
    env = [
        {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"},
        {"name": "HF_HOME", "value": f"{names.MODELS_MOUNT}/hf"},
        {"name": "HOME", "value": "/tmp"},
        *api_key_env(pool),
        *credentials_env(pool),
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
        "lifecycle": {"preStop": {"sleep": {"seconds": ENDPOINTS_SETTLE_S}}},  # no shell needed (Kubernetes 1.30+)
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "adapters", "mountPath": names.ADAPTERS_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "models", "mountPath": names.MODELS_MOUNT},
            *base_model_mounts(pool),
            *source_mounts,
        ],
        # vLLM compiles kernels into ~/.cache and /tmp, so its root filesystem stays writable.
        "securityContext": restricted(read_only_root=False),
    }
