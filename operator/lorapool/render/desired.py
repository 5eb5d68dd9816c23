"""A pool's whole desired state, in the one order: plan -> place -> render. Pure.

Called by the operator (``controller.decide.decide``, with the adapters it judged servable, the
engine and router pods it read and the pool's last status) and by ``lorapool render``
(``commands.render``: ranks from the spec, no pods, no status: the placement a new pool starts
from), so the order and what feeds each step are written once and both print or apply the same
objects.

It lives here, at the render layer, because it calls all three steps: ``plan.planner.plan_pool``
and ``plan.holders`` below it and ``render.manifests.render_pool`` beside it. ``plan/`` may not
import ``render/``, and under ``controller/`` the offline commands would have to import the
operator to reach it; every caller of the desired state sits above ``render/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.models import LoRAPool
from lorapool.api.pods import EnginePod, RouterPod
from lorapool.api.report import adapter_identity
from lorapool.errors import PlanError
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.holders import Placement, decide_placement, observed_load, previous_k
from lorapool.plan.planner import AdapterRank, Plan, plan_pool
from lorapool.render.configmaps import AdapterSetTooLarge
from lorapool.render.manifests import RenderOptions, render_pool

Obj = dict[str, Any]


@dataclass(frozen=True)
class Desired:
    """What a pool should be: its plan (or why there is none), where each adapter lives, its children."""

    plan: Plan | None
    plan_errors: tuple[str, ...] = ()  # the PlanError's problems while there is no plan
    placement: Placement | None = None  # None while the plan is invalid
    objects: tuple[Obj, ...] = ()  # children to apply (or print), in order; none while the plan is invalid
    identities: Mapping[str, str] = field(default_factory=dict)  # rendered adapter -> identity the sidecars load


def desired_state(
    pool: LoRAPool,
    adapters: Sequence[tuple[PoolAdapter, int | None]],
    options: RenderOptions,
    *,
    pods: Sequence[EnginePod] = (),
    routers: Sequence[RouterPod] = (),
    status: Mapping[str, Any] | None = None,
    now: float = 0.0,
    tuned: int | None = None,
) -> Desired:
    """Plan the servable ``adapters`` (each with the rank the planner sees, None: unknown), place them,
    render the children. A PlanError becomes ``plan_errors``; nothing is placed or rendered then.

    ``pods`` (engine pods with their sidecars' reports), ``routers`` (router pods with their request
    counts), the pool's last ``status`` and ``now`` (Unix seconds) feed placement; left empty, every
    adapter is placed as on a new pool. ``tuned``: the --max-loras the sizing loop applies.
    """
    ranks = [AdapterRank(a.spec.name, a.field, rank) for a, rank in adapters]
    try:
        plan = plan_pool(pool.spec, ranks, tuned=tuned)
    except PlanError as exc:
        return Desired(None, exc.problems)
    names = [a.spec.name for a, _ in adapters]
    placement = decide_placement(
        pool, names, plan.max_cpu_loras, previous_k(status), observed_load(pods, routers, now), now
    )
    served = [a for a, _ in adapters]
    try:
        objects = render_pool(pool, plan, served, options, placement.holders)
    except AdapterSetTooLarge as exc:  # beyond every shard: a spec the user must change, as a plan error
        return Desired(None, (str(exc),))
    identities = {a.spec.name: adapter_identity(a.spec.source, a.spec.revision, a.spec.sha256) for a in served}
    return Desired(plan, (), placement, tuple(objects), identities)
