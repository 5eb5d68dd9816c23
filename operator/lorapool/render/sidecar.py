"""The adapter-sync sidecar container of every engine pod, and the two volumes only it mounts (its
projected ServiceAccount token and its placement slot file). Pure.

Called by ``lorapool.render.engine``, which puts it beside vLLM in the engine pod template. The
sidecar syncs ``<pool>-adapters`` into the engine (``lorapool.sidecar``) and reports what it
holds on its own Pod, hence its token.
"""

from __future__ import annotations

from dataclasses import replace

from lorapool.api.models import LoRAPool
from lorapool.errors import PlanError
from lorapool.plan.adapter_check import BaseShape
from lorapool.plan.planner import resolve_dims
from lorapool.render import names
from lorapool.render.common import Obj, RenderOptions, api_key_env, own_pod_env, restricted
from lorapool.render.source_access import credentials_env

BASE_SHAPE_ENV = "LORAPOOL_BASE_SHAPE"  # read by lorapool.sidecar.cli


def base_shape_env(pool: LoRAPool) -> list[Obj]:
    """The base model's shape, which the sidecar verifies every download against (``sources.verify``).

    From the dims the planner uses (``spec.baseModel.architecture`` or its table); it depends on the
    base model only, so the pod template changes with the base, never with the adapters. None known:
    no variable, and the sidecar checks config and weights only.
    """
    try:
        dims = resolve_dims(pool.spec)
    except PlanError:
        return []
    # The table's models are Llama-style; an architecture given in the spec says nothing of module names.
    layout = pool.spec.base_model.architecture is None
    shape = replace(BaseShape.from_dims(dims), name=pool.spec.base_model.name, llama_layout=layout)
    return [{"name": BASE_SHAPE_ENV, "value": shape.to_json()}]


def _sidecar_args(pool: LoRAPool) -> list[str]:
    keep = pool.spec.sidecar.keep_unloaded
    return [
        "sidecar",
        # Read and watched through the API (lorapool.sources.setwatch); the kubelet expands $(POD_NAMESPACE).
        "--adapters-configmap",
        f"$(POD_NAMESPACE)/{names.adapters_configmap(pool.metadata.name)}",
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
        "--keep-unloaded-bytes",
        str(keep.max_bytes),
        "--keep-unloaded-max-age",
        str(keep.max_age_seconds),
    ]


def sidecar_container(pool: LoRAPool, opts: RenderOptions, source_mounts: list[Obj]) -> Obj:
    """Container ``adapter-sync``; ``source_mounts`` are the mounted adapter sources it copies from."""
    spec = pool.spec
    return {
        "name": "adapter-sync",
        "image": spec.sidecar.image or opts.lorapool_image,
        "imagePullPolicy": opts.image_pull_policy,
        "args": _sidecar_args(pool),
        "env": [
            {"name": "HF_HOME", "value": "/tmp/hf"},
            *own_pod_env(),  # the Pod it reports on (lorapool.api.report)
            *api_key_env(pool),
            *credentials_env(pool),
            *base_shape_env(pool),
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
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "report-token", "mountPath": names.SERVICE_ACCOUNT_MOUNT, "readOnly": True},
            {"name": "podinfo", "mountPath": names.PODINFO_MOUNT, "readOnly": True},
            *source_mounts,
        ],
        "securityContext": restricted(read_only_root=True),
    }


def podinfo_volume() -> Obj:
    """The pod's placement slot as a file the kubelet refreshes when the operator sets the annotation
    (empty until then); mounted into the sidecar only."""
    field = f"metadata.annotations['{names.SLOT_ANNOTATION}']"
    return {"name": "podinfo", "downwardAPI": {"items": [{"path": names.SLOT_FILE, "fieldRef": {"fieldPath": field}}]}}


def report_token_volume() -> Obj:
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
