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
    """The sidecars' only right: patch the status (report annotation and condition) of pods in the namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(pool, names.engine_service_account(pool.metadata.name), "engine"),
        "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}],
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
        ],
    }


def router_rolebinding(pool: LoRAPool) -> Obj:
    return _own_binding(pool, names.router(pool.metadata.name), "router")
