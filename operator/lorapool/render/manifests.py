"""Render a pool and its plan into the Kubernetes objects the operator applies. Pure.

``render_pool`` is what `lorapool render` prints and what the operator server-side
applies, object for object, so a GitOps review of the output is a review of the
cluster. Adapters change only the ``<pool>-adapters`` ConfigMap and its shards (the sidecars
watch them through the API and hot-load the adapters) and their priorities and limits only ``<pool>-traffic`` (the routers re-read it), as the
routers' policy changes only ``<pool>-router-policy``; the engine pod template changes, and pods
roll, only when vLLM's flags do.

Called by the operator (``lorapool.controller``), ``lorapool render`` and the tests. This module
composes; each object kind is rendered in its own module, whose public names it re-exports:

- ``configmaps``: ``<pool>-adapters`` (and its shards ``<pool>-adapters-<i>``), ``<pool>-traffic``
  and ``<pool>-router-policy``;
- ``engine``: the engine Deployment, its pod template and vLLM container (``sidecar``: the
  adapter-sync container; ``source_access``: what the pod needs to reach its sources);
- ``services``: the engine and router Services; ``policies``: the engines' PDB and NetworkPolicy;
- ``rbac``: ServiceAccounts, Roles, RoleBindings; ``router``: the router Deployment;
- ``gateway``: the InferencePool and its picker (docs/gateway.md); ``names``: every object name.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.api.models import LoRAPool
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.planner import Plan
from lorapool.render import books, gateway
from lorapool.render.common import Obj as Obj
from lorapool.render.common import RenderOptions as RenderOptions
from lorapool.render.configmaps import Holders as Holders
from lorapool.render.configmaps import adapter_set as adapter_set
from lorapool.render.configmaps import adapters_configmap as adapters_configmap
from lorapool.render.configmaps import adapters_configmaps as adapters_configmaps
from lorapool.render.configmaps import router_policy as router_policy
from lorapool.render.configmaps import router_policy_configmap as router_policy_configmap
from lorapool.render.configmaps import shard_leftovers as shard_leftovers
from lorapool.render.configmaps import traffic_configmap as traffic_configmap
from lorapool.render.configmaps import traffic_policy as traffic_policy
from lorapool.render.engine import config_hash as config_hash
from lorapool.render.engine import engine_args as engine_args
from lorapool.render.engine import engine_deployment as engine_deployment
from lorapool.render.policies import engine_network_policy as engine_network_policy
from lorapool.render.policies import engine_pdb as engine_pdb
from lorapool.render.policies import router_pdb as router_pdb
from lorapool.render.rbac import engine_role as engine_role
from lorapool.render.rbac import engine_rolebinding as engine_rolebinding
from lorapool.render.rbac import engine_serviceaccount as engine_serviceaccount
from lorapool.render.rbac import router_role as router_role
from lorapool.render.rbac import router_rolebinding as router_rolebinding
from lorapool.render.rbac import router_serviceaccount as router_serviceaccount
from lorapool.render.router import router_deployment as router_deployment
from lorapool.render.services import engine_service as engine_service
from lorapool.render.services import router_service as router_service


def render_pool(
    pool: LoRAPool,
    plan: Plan,
    adapters: Sequence[PoolAdapter],
    options: RenderOptions | None = None,
    holders: Holders | None = None,
) -> list[Obj]:
    """Every child object of ``pool``, in apply order (the adapter set's shards before its index, which
    names them: a sidecar following the index never meets a shard not written yet).

    ``holders`` is the placement (``lorapool.plan.placement``) in replica slots; None while every
    replica holds every adapter (small pools, and offline renders without observed load).
    """
    opts = options or RenderOptions()
    objects = [
        *adapters_configmaps(pool, plan, adapters, holders),
        traffic_configmap(pool, adapters),
        engine_service(pool),
        engine_serviceaccount(pool),
        engine_role(pool),
        engine_rolebinding(pool),
        engine_deployment(pool, plan, adapters, opts),
        engine_pdb(pool),
        *([engine_network_policy(pool)] if pool.spec.security.network_policy else []),
        router_serviceaccount(pool),
        router_role(pool),
        router_rolebinding(pool),
        router_policy_configmap(pool, plan),
        *([router_service(pool)] if pool.spec.router.http else []),
        *books.store_objects(pool, opts),  # a rendered shared store, before the routers that use it
        router_deployment(pool, opts),
        *router_pdb(pool),  # with several routers
        *gateway.gateway_objects(pool),  # the InferencePool and its picker (docs/gateway.md)
    ]
    return [_owned(pool, obj) for obj in objects]


def _owned(pool: LoRAPool, obj: Obj) -> Obj:
    """ownerReferences to the pool when it exists in a cluster (offline renders have no uid)."""
    if pool.metadata.uid:
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": pool.api_version,
                "kind": "LoRAPool",
                "name": pool.metadata.name,
                "uid": pool.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return obj
