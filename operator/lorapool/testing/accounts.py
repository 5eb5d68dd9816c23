"""A pool's rendered ServiceAccounts, Roles and RoleBindings in a namespace, with no LoRAPool object.

Cluster tests that check what a component may do run it as the account the operator renders for
it, so they prove that Role suffices (or refuses). No LoRAPool exists there to own the objects, so
their owner references are dropped (the garbage collector would delete them at once otherwise).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from lorapool.api.models import LoRAPool
from lorapool.render import manifests

Render = Callable[[LoRAPool], dict[str, Any]]
RBAC: dict[str, tuple[Render, Render, Render]] = {
    "engine": (manifests.engine_serviceaccount, manifests.engine_role, manifests.engine_rolebinding),
    "router": (manifests.router_serviceaccount, manifests.router_role, manifests.router_rolebinding),
}


def bare_pool(name: str, namespace: str) -> LoRAPool:
    """The smallest valid pool: enough to render its accounts and Roles."""
    return LoRAPool.model_validate(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name))},
            "spec": {
                "baseModel": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": "hf://meta-llama/x"},
                "gpu": {"product": "A100-80GB"},
            },
        }
    )


def create_accounts(core: Any, rbac: Any, pool: LoRAPool, components: Iterable[str]) -> None:
    """Create each component's rendered ServiceAccount, Role and RoleBinding (kubernetes' CoreV1Api,
    RbacAuthorizationV1Api) in the pool's namespace."""
    ns = pool.metadata.namespace
    for component in components:
        account, role, binding = (_unowned(render(pool)) for render in RBAC[component])
        core.create_namespaced_service_account(ns, account)
        rbac.create_namespaced_role(ns, role)
        rbac.create_namespaced_role_binding(ns, binding)


def _unowned(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].pop("ownerReferences", None)
    return obj
