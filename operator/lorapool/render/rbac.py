"""The ServiceAccounts, Roles and RoleBindings of the engine and the router pods. Pure.

Called by ``lorapool.render.manifests.render_pool`` (and by the test cluster's account helper,
through the names ``lorapool.render.manifests`` re-exports). Each component's three objects share
one name; each Role holds only what its pods call.
"""

from __future__ import annotations

from lorapool.api.models import LoRAPool
from lorapool.render import names
from lorapool.render.common import Obj, meta


def engine_serviceaccount(pool: LoRAPool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(pool, names.engine_service_account(pool.metadata.name), "engine"),
        "automountServiceAccountToken": False,  # the pod template projects the token into the sidecar only
    }


def engine_role(pool: LoRAPool) -> Obj:
    """The sidecars' rights: patch the status (report annotation and condition) of pods in the
    namespace, and read and watch the pool's adapter set, its index and every shard slot by name
    (a fixed list, so a change of the shard count never changes the Role). A watch is allowed by
    ``resourceNames`` when it selects one name (``fieldSelector=metadata.name=...``), as the sidecar's does."""
    p = pool.metadata.name
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(pool, names.engine_service_account(p), "engine"),
        "rules": [
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
            _adapter_set_rule(p),
        ],
    }


def _adapter_set_rule(pool: str) -> Obj:
    """Read and watch the pool's adapter set (its index and every shard slot) by name, nothing else."""
    return {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [names.adapters_configmap(pool), *names.adapter_shards(pool)],
        "verbs": ["get", "list", "watch"],
    }


def _own_binding(pool: LoRAPool, name: str, component: str) -> Obj:
    """The RoleBinding of a component's Role to its ServiceAccount (all three share ``name``)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(pool, name, component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.metadata.namespace}],
    }


def engine_rolebinding(pool: LoRAPool) -> Obj:
    return _own_binding(pool, names.engine_service_account(pool.metadata.name), "engine")


def router_serviceaccount(pool: LoRAPool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(pool, names.router(pool.metadata.name), "router"),
        "automountServiceAccountToken": True,
    }


def router_role(pool: LoRAPool) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(pool, names.router(pool.metadata.name), "router"),
        "rules": [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            # The engine pods' sidecar reports (docs/status.md): the router routes by them.
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            # Its request counts per adapter on its own Pod (lorapool.io/requests, docs/placement.md).
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
            # Which adapters the pool has (--adapters-configmap): one it names is held while it loads.
            _adapter_set_rule(pool.metadata.name),
        ],
    }


def router_rolebinding(pool: LoRAPool) -> Obj:
    return _own_binding(pool, names.router(pool.metadata.name), "router")
