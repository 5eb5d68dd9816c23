"""The gateway door's truth (docs/gateway.md): whether the InferencePool API is served, what the
gateways say of the pool's InferencePool, and the pool's ``InferencePoolReady`` condition. Pure.

The InferencePool CRD belongs to the Gateway API Inference Extension, not to lorapool: a cluster
may not have it. Then the operator applies everything else, leaves the InferencePool out and says
what to install; once the API is served (the reconcile re-reads discovery, ``DISCOVERY_TTL_S``)
the next pass applies it, without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lorapool.api.models import LoRAPool
from lorapool.api.status import Condition, ConditionType, condition
from lorapool.render import names

INFERENCE_POOL_KIND = "InferencePool"
GROUP_VERSION = f"{names.INFERENCE_POOL_GROUP}/{names.INFERENCE_POOL_VERSION}"
PLURAL = "inferencepools"
# How long a discovery answer is trusted: a CRD installed now is used within this plus one resync.
DISCOVERY_TTL_S = 30.0
INSTALL_HINT = (
    f"the {INFERENCE_POOL_KIND} API ({GROUP_VERSION}) is not served by this cluster: install the Gateway API "
    "Inference Extension CRDs (v1.0 or later, e.g. kubectl apply -f https://github.com/kubernetes-sigs/"
    "gateway-api-inference-extension/releases/latest/download/manifests.yaml) or a gateway that ships them; "
    "lorapool applies the InferencePool once the API appears, and everything else is served meanwhile"
)


@dataclass(frozen=True)
class GatewayObserved:
    """What the ``InferencePoolReady`` condition is computed from."""

    namespace: str
    name: str  # the InferencePool's (names.inference_pool)
    served: bool  # the cluster serves inference.networking.k8s.io/v1 inferencepools
    inference_pool: Mapping[str, Any] | None  # the live InferencePool, None when absent
    picker_ready: bool  # a router pod (the picker) is ready

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def without_unserved(objects: Sequence[dict[str, Any]], served: bool) -> list[dict[str, Any]]:
    """The rendered objects the cluster can take: the InferencePool only while its API is served."""
    return [o for o in objects if served or o["kind"] != INFERENCE_POOL_KIND]


def door_leftovers(pool: LoRAPool, served: bool) -> list[tuple[str, str]]:
    """(kind, name) of the door objects an earlier spec rendered and this one does not: a pool moved
    from one door to the other must not keep a router Service, or an InferencePool whose picker
    listener is gone, that a client or a gateway would still use."""
    p = pool.metadata.name
    gone: list[tuple[str, str]] = []
    if not pool.spec.router.http:
        gone.append(("Service", names.router_service(p)))
    if not pool.spec.router.picker:
        gone += [("Service", names.endpoint_picker(p)), ("NetworkPolicy", names.router_network_policy(p))]
        gone += [(INFERENCE_POOL_KIND, names.inference_pool(p))] if served else []
    elif not pool.spec.security.network_policy:
        gone.append(("NetworkPolicy", names.router_network_policy(p)))
    return gone + router_leftovers(pool)


def router_leftovers(pool: LoRAPool) -> list[tuple[str, str]]:
    """(kind, name) of the routers' objects an earlier spec rendered and this one does not: the shared
    store ``<pool>-books`` once ``sharedState.rendered`` is gone (its books with it: the routers now use
    another store or their own), the routers' PodDisruptionBudget once one router is left."""
    p = pool.metadata.name
    shared = pool.spec.router.shared_state
    gone: list[tuple[str, str]] = []
    if shared is None or shared.rendered is None:
        store = names.books_store(p)
        gone += [("Deployment", store), ("Service", store), ("NetworkPolicy", store)]
    if pool.spec.router.replicas <= 1:
        gone.append(("PodDisruptionBudget", names.router(p)))
    return gone


def controlled_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether the pool (its uid) controls ``obj``: only those are ever deleted, never a user's."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return uid is not None and any(r.get("uid") == uid and r.get("controller") for r in refs)


def _parent_name(parent: Mapping[str, Any]) -> str:
    ref = parent.get("parentRef") or {}
    kind = ref.get("kind") or "Gateway"
    where = f"{ref['namespace']}/" if ref.get("namespace") else ""
    return f"{kind} {where}{ref.get('name', '?')}"


def _accepted(parent: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((c for c in parent.get("conditions") or () if c.get("type") == "Accepted"), {})


def inference_pool_condition(g: GatewayObserved, generation: int | None) -> Condition:
    """True only when a gateway accepted the InferencePool and the picker it names is ready: then an
    HTTPRoute's requests are routed. Otherwise the reason says which of those is missing."""
    kind = ConditionType.INFERENCE_POOL_READY
    ref = f"{INFERENCE_POOL_KIND} {g.ref}"
    if not g.served:
        return condition(kind, False, "InferencePoolCRDMissing", INSTALL_HINT, generation)
    if g.inference_pool is None:
        return condition(kind, False, "NotApplied", f"{ref} does not exist yet", generation)
    if not g.picker_ready:
        return condition(kind, False, "PickerNotReady", "no router pod serves the endpoint picker yet", generation)
    parents = ((g.inference_pool.get("status") or {}).get("parents")) or []
    accepted = [_parent_name(p) for p in parents if _accepted(p).get("status") == "True"]
    if accepted:
        return condition(kind, True, "Accepted", f"{ref} is accepted by {', '.join(accepted)}", generation)
    refused = [
        f"{_parent_name(p)}: {_accepted(p).get('reason', 'Pending')} {_accepted(p).get('message', '')}".rstrip()
        for p in parents
    ]
    if refused:
        return condition(kind, False, "NotAccepted", f"{ref}: {'; '.join(refused)}", generation)
    return condition(
        kind,
        False,
        "NoParent",
        f"no Gateway reports {ref}: reference it as a backendRef (group {names.INFERENCE_POOL_GROUP}, kind "
        f"{INFERENCE_POOL_KIND}) from an HTTPRoute of a GIE-conformant gateway (docs/gateway.md)",
        generation,
    )
