"""The pool's ConfigMaps: ``<pool>-adapters`` (the adapter set the sidecars sync, with its shards
``<pool>-adapters-<i>`` when it is large), ``<pool>-traffic``
(the priorities and limits the routers enforce) and ``<pool>-router-policy`` (the routers' policy
document, from ``spec.router`` and the plan's slots). Pure.

Called by ``lorapool.render.manifests.render_pool``. Adapters change only the first two, never
the engine pod template, so adding or removing one rolls no pod; a change of ``spec.router``'s
policy, prefixWeight or dispatch, or of the plan's maxLoras/maxCpuLoras, changes only the third
(and the engines), which the routers re-read live: no router pod rolls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.api.adapterset import (
    CONFIGMAP_KEY,
    INDEX_KEY,
    MAX_SHARDS,
    SHARD_BYTES,
    AdapterSet,
    AdapterSetIndex,
    DesiredAdapter,
    ShardRef,
    content_hash,
    shard_of,
)
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


class AdapterSetTooLarge(ValueError):
    """More adapters than MAX_SHARDS shards of the byte budget hold: the pool must be split."""


def shard_count(whole: AdapterSet, shard_bytes: int = SHARD_BYTES) -> int:
    """How many shards ``whole`` needs: 0 (inline) while its text fits ``shard_bytes``, else the
    smallest power of two whose every shard fits. Powers of two keep ``shard_of`` stable: a growing
    set moves half of the adapters once per doubling, and adding one adapter rewrites one shard."""
    if len(whole.to_json().encode()) <= shard_bytes:
        return 0
    count = 2
    while count <= MAX_SHARDS:
        if all(len(part.to_json().encode()) <= shard_bytes for part in split(whole, count)):
            return count
        count *= 2
    raise AdapterSetTooLarge(
        f"pool {whole.pool}: {len(whole.adapters)} adapters do not fit {MAX_SHARDS} shards of "
        f"{shard_bytes} bytes; split them across pools"
    )


def split(whole: AdapterSet, count: int) -> list[AdapterSet]:
    """``whole`` cut into ``count`` sets by ``shard_of`` (each keeps the set's order); none for 0 (inline)."""
    if count == 0:
        return []
    parts: list[list[DesiredAdapter]] = [[] for _ in range(count)]
    for adapter in whole.adapters:
        parts[shard_of(adapter.name, count)].append(adapter)
    return [whole.model_copy(update={"adapters": tuple(part)}) for part in parts]


def adapters_configmaps(
    pool: LoRAPool,
    plan: Plan,
    adapters: Sequence[PoolAdapter],
    holders: Holders | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> list[Obj]:
    """The set's ConfigMaps in apply order: the shards first, then the index ``<pool>-adapters`` that
    names them by hash, so a reader following the index never finds a shard missing or stale."""
    p = pool.metadata.name
    whole = adapter_set(pool, plan, adapters, holders)
    text = whole.to_json()
    count = shard_count(whole, shard_bytes)
    shards = [
        (names.adapter_shard(p, i), part.to_json(), len(part.adapters)) for i, part in enumerate(split(whole, count))
    ]
    index = AdapterSetIndex(
        pool=p,
        generation=content_hash(text),
        shards=tuple(ShardRef(name=name, sha256=content_hash(body), adapters=n) for name, body, n in shards),
    )
    data = {INDEX_KEY: index.to_json(), **({} if shards else {CONFIGMAP_KEY: text})}
    return [
        *(_configmap(pool, name, {CONFIGMAP_KEY: body}) for name, body, _ in shards),
        _configmap(pool, names.adapters_configmap(p), data),
    ]


def adapters_configmap(
    pool: LoRAPool, plan: Plan, adapters: Sequence[PoolAdapter], holders: Holders | None = None
) -> Obj:
    """The index ``<pool>-adapters`` alone (with the whole set inline when it is small)."""
    return adapters_configmaps(pool, plan, adapters, holders)[-1]


def shard_leftovers(pool: str, objects: Sequence[Obj]) -> list[str]:
    """The shard slots ``objects`` do not render: after a set shrinks, the ConfigMaps to delete."""
    rendered = {o["metadata"]["name"] for o in objects if o.get("kind") == "ConfigMap"}
    return [name for name in names.adapter_shards(pool) if name not in rendered]


def _configmap(pool: LoRAPool, name: str, data: dict[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(pool, name, "adapters"), "data": data}


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
