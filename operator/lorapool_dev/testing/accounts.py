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
from lorapool_dev.testing.wait import wait_until

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


def create_accounts(
    core: Any, rbac: Any, pool: LoRAPool, components: Iterable[str], *, timeout_s: float = 30.0
) -> None:
    """Create each component's rendered ServiceAccount, Role and RoleBinding (kubernetes' CoreV1Api,
    RbacAuthorizationV1Api) in the pool's namespace, and return once the API server grants them.

    The API server's authorizer learns of a new RoleBinding from its own watch, a moment after the
    create returns: until then the account is refused with a 403 that says nothing of the Role. So
    each rule of each Role is asked of the authorizer (a SubjectAccessReview, as ``kubectl auth
    can-i`` does) until it is allowed."""
    from kubernetes import client as k8s

    ns = pool.metadata.namespace
    authz = k8s.AuthorizationV1Api(core.api_client)
    granted: list[tuple[str, dict[str, Any]]] = []
    for component in components:
        account, role, binding = (_unowned(render(pool)) for render in RBAC[component])
        core.create_namespaced_service_account(ns, account)
        rbac.create_namespaced_role(ns, role)
        rbac.create_namespaced_role_binding(ns, binding)
        user = f"system:serviceaccount:{ns}:{account['metadata']['name']}"
        granted += [(user, attributes) for attributes in _rule_attributes(ns, role["rules"])]

    def allowed(user: str, attributes: dict[str, Any]) -> bool:
        review = k8s.V1SubjectAccessReview(
            spec=k8s.V1SubjectAccessReviewSpec(user=user, resource_attributes=k8s.V1ResourceAttributes(**attributes))
        )
        status = authz.create_subject_access_review(review).status
        return bool(status is not None and status.allowed)

    def ungranted() -> list[tuple[str, dict[str, Any]]]:
        return [(user, attributes) for user, attributes in granted if not allowed(user, attributes)]

    wait_until("the RoleBindings in effect", lambda: not ungranted(), timeout_s, describe=ungranted)


def _rule_attributes(namespace: str, rules: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One SubjectAccessReview's resourceAttributes per (group, resource, verb) a Role's rules grant."""
    asked = []
    for rule in rules:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule["resources"]:
                name, _, subresource = resource.partition("/")
                for verb in rule["verbs"]:
                    attributes = {"namespace": namespace, "group": group, "resource": name, "verb": verb}
                    if subresource:
                        attributes["subresource"] = subresource
                    if rule.get("resourceNames"):  # a rule for named objects grants nothing unnamed
                        attributes["name"] = rule["resourceNames"][0]
                    asked.append(attributes)
    return asked


def _unowned(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].pop("ownerReferences", None)
    return obj
