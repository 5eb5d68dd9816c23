"""What every per-kind render module shares: the options the operator sets, object metadata, and
the container plumbing both pods carry (a restricted securityContext, the downward-API and the API
key env). Pure.

Called by the per-kind modules (``configmaps``, ``engine``, ``sidecar``, ``rbac``, ``services``,
``policies``, ``router``) that ``lorapool.render.manifests`` composes; ``RenderOptions`` is
re-exported there, where the operator and ``lorapool render`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lorapool.api.models import DEFAULT_LORAPOOL_IMAGE, LoRAPool
from lorapool.render import names

Obj = dict[str, Any]


@dataclass(frozen=True)
class RenderOptions:
    """What the renderer needs beyond the pool: set by the operator from its own config."""

    lorapool_image: str = DEFAULT_LORAPOOL_IMAGE
    image_pull_policy: str = "IfNotPresent"


def meta(pool: LoRAPool, name: str, component: str) -> Obj:
    """An object's metadata: its name in the pool's namespace and the pool's labels for ``component``."""
    return names.metadata(pool.metadata.namespace, name, pool.metadata.name, component)


def restricted(read_only_root: bool) -> Obj:
    """A container securityContext the restricted Pod Security Standard admits."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def own_pod_env() -> list[Obj]:
    """POD_NAME / POD_NAMESPACE from the downward API: the Pod a container writes its status on
    (``lorapool.podstatus.PodRef.from_env``)."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def api_key_env(pool: LoRAPool) -> list[Obj]:
    """The engines' API key from its Secret: vLLM requires it, the router and the sidecar send it."""
    ref = pool.spec.security.api_key_secret_ref
    if ref is None:
        return []
    return [{"name": names.ENGINE_API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]
