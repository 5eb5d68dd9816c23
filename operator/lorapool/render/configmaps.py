"""The pool's ConfigMaps: ``<pool>-adapters`` (the adapter set the sidecars sync), ``<pool>-traffic``
(the priorities and limits the routers enforce) and ``<pool>-router-policy`` (the routers' policy
document, from ``spec.router`` and the plan's slots). Pure.

Called by ``lorapool.render.manifests.render_pool``. Adapters change only the first two, never
the engine pod template, so adding or removing one rolls no pod; a change of ``spec.router``'s
policy, prefixWeight or dispatch, or of the plan's maxLoras/maxCpuLoras, changes only the third
(and the engines), which the routers re-read live: no router pod rolls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.api.adapterset import CONFIGMAP_KEY, AdapterSet, DesiredAdapter
from lorapool.api.models import DispatchSpec, LoRAPool
from lorapool.api.routerpolicy import (
    ROUTER_POLICY_CONFIGMAP_KEY,
    DispatchParameters,
    RouterPolicyDocument,
    ScorerName,
    SlotParameters,
    named_document,
)
from lorapool.api.traffic import TRAFFIC_CONFIGMAP_KEY, TrafficPolicy
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.planner import Plan
from lorapool.render import names
from lorapool.render.common import Obj, meta

Holders = Mapping[str, Sequence[int]]  # adapter -> the replica slots placed to hold it


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
        "metadata": meta(pool, names.adapters_configmap(pool.metadata.name), "adapters"),
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
        "metadata": meta(pool, names.traffic_configmap(pool.metadata.name), "traffic"),
        "data": {TRAFFIC_CONFIGMAP_KEY: traffic_policy(pool, adapters).to_json()},
    }


def _dispatch(spec: DispatchSpec) -> DispatchParameters:
    """``spec.router.dispatch`` as the document's ``dispatch`` (an unset cap: 0, no cap)."""
    return DispatchParameters(
        fair=spec.fair,
        max_prefilling=spec.max_prefilling or 0,
        max_inflight=spec.max_inflight or 0,
        max_queue_wait_seconds=spec.max_queue_wait_seconds,
    )


def router_policy(pool: LoRAPool, plan: Plan | None = None) -> RouterPolicyDocument:
    """The routers' policy document: ``spec.router.policy``, with the prefix scorer's weight when
    ``prefixWeight`` turns it on (a named policy, so the router's registry spells the chain out), how
    held requests bind and wait (``spec.router.dispatch``) and the plan's LoRA slots, which the routers
    assume until the engines report theirs (``plan`` None: no slots, the router's defaults)."""
    router = pool.spec.router
    weights = {ScorerName.PREFIX: router.prefix_weight} if router.prefix_weight > 0 else None
    doc = named_document(router.policy, weights=weights)
    slots = (
        SlotParameters() if plan is None else SlotParameters(max_loras=plan.max_loras, max_cpu_loras=plan.max_cpu_loras)
    )
    return doc.model_copy(update={"dispatch": _dispatch(router.dispatch), "slots": slots})


def router_policy_configmap(pool: LoRAPool, plan: Plan | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(pool, names.router_policy_configmap(pool.metadata.name), "router"),
        "data": {ROUTER_POLICY_CONFIGMAP_KEY: router_policy(pool, plan).to_json()},
    }
