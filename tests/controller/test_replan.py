"""Re-plans that restart the engines (issue 44 item 2): the pure decision as a table, then the real
planner and renderer over a sequence of reconcile passes (``controller.decide.decide`` fed what the
shell would feed it: the engine Deployment it last applied, the pool's last status, the clock)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.api.status import AdapterPhase
from lorapool.controller import decide, replan
from lorapool.controller.replan import Action, Flags, Inputs, Seen
from lorapool.controller.status import AdapterResult
from lorapool.errors import SpecError
from lorapool.plan.adapters import merge_adapters
from lorapool.render import names
from lorapool.render.desired import desired_state
from lorapool.render.manifests import RenderOptions

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"
F8, F16 = Flags(8, 16, 64), Flags(16, 16, 64)


def inputs(running: Flags | None, wanted: Flags, **kw: Any) -> Inputs:
    base: dict[str, Any] = {"auto": True, "changed_at": None, "now": 100.0, "settle_s": 10.0, "approval": False}
    return Inputs(running=running, wanted=wanted, **{**base, **kw})


H = replan.plan_hash(F8, F16)
TABLE = {
    "first-template-waits-for-the-window": (inputs(None, F8, changed_at=95.0), Action.FIRST, 5.0),
    "first-template-once-settled": (inputs(None, F8, changed_at=80.0), Action.APPLY, None),
    "first-template-of-an-old-catalogue": (inputs(None, F8), Action.APPLY, None),
    "unchanged": (inputs(F8, F8, changed_at=99.0), Action.APPLY, None),
    "estimate-grew-a-little": (inputs(Flags(157, 16, 400), Flags(173, 16, 400)), Action.KEEP, None),
    "estimate-shrank-a-little": (inputs(F16, Flags(9, 16, 64)), Action.KEEP, None),
    "estimate-halved": (inputs(F16, F8, announced=replan.plan_hash(F16, F8)), Action.APPLY, None),
    "explicit-value-has-no-band": (inputs(Flags(157, 16, 400), Flags(173, 16, 400), auto=False), Action.ANNOUNCE, 0.0),
    "rank-change-has-no-band": (inputs(F8, Flags(8, 64, 64)), Action.ANNOUNCE, 0.0),
    "growth-within-the-window": (inputs(F8, F16, changed_at=97.0), Action.SETTLE, 7.0),
    "growth-after-the-window-announced-first": (inputs(F8, F16, changed_at=50.0), Action.ANNOUNCE, 0.0),
    "growth-announced-applies": (inputs(F8, F16, changed_at=50.0, announced=H), Action.APPLY, None),
    "stamp-from-a-clock-ahead": (inputs(F8, F16, changed_at=130.0), Action.SETTLE, 10.0),
    "approval-held": (inputs(F8, F16, approval=True, announced=H), Action.APPROVAL, None),
    "approval-for-a-stale-plan-ignored": (
        inputs(F8, F16, approval=True, approved=replan.plan_hash(F8, Flags(32, 16, 64)), announced=H),
        Action.APPROVAL,
        None,
    ),
    "approval-of-this-plan": (inputs(F8, F16, approval=True, approved=H, announced=H), Action.APPLY, None),
    "approval-waits-the-window-first": (
        inputs(F8, F16, approval=True, approved=H, changed_at=99.0),
        Action.SETTLE,
        9.0,
    ),
}


@pytest.mark.parametrize(("i", "action", "after_s"), list(TABLE.values()), ids=list(TABLE))
def test_decide_replan(i: Inputs, action: Action, after_s: float | None) -> None:
    r = replan.decide_replan(i)
    assert (r.action, r.after_s) == (action, after_s)
    assert r.hash == replan.plan_hash(i.running, i.wanted)


def test_a_plan_hash_names_the_change_not_only_its_target() -> None:
    assert replan.plan_hash(F8, F16) != replan.plan_hash(Flags(8, 16, 32), F16)
    assert replan.plan_hash(F8, F16) == replan.plan_hash(Flags(8, 16, 64), Flags(16, 16, 64))


def test_catalogue_seen_dates_a_change_by_the_clock_and_a_first_sight_by_metadata() -> None:
    first = replan.catalogue_seen(None, [("b", 16), ("a", 8)], [10.0, 40.0], now=100.0)
    assert first == Seen((("a", 8), ("b", 16)), 40.0)  # an operator restart alone delays nothing
    assert replan.catalogue_seen(first, [("a", 8), ("b", 16)], [], now=200.0) is first
    assert replan.catalogue_seen(first, [("a", 8), ("b", 32)], [], now=200.0).changed_at == 200.0  # a rank
    assert replan.catalogue_seen(first, [("a", 8)], [], now=300.0).changed_at == 300.0  # a deletion
    assert replan.catalogue_seen(None, [], [], now=5.0).changed_at is None


def test_metadata_stamps_skip_status_writes_and_bad_times() -> None:
    adapter = {
        "metadata": {
            "creationTimestamp": "2026-12-07T10:00:00Z",
            "managedFields": [
                {"manager": "kubectl", "time": "2026-12-07T10:05:00Z"},
                {"manager": "lorapool", "subresource": "status", "time": "2026-12-07T11:00:00Z"},
                {"manager": "odd", "time": "yesterday"},
            ],
        }
    }
    pool_without_inline = {"metadata": {"creationTimestamp": "2026-12-07T09:00:00Z"}, "spec": {}}
    stamps = replan.metadata_stamps(pool_without_inline, [adapter])
    assert sorted(stamps) == [1796634000.0, 1796637600.0, 1796637900.0]
    with_inline = {"metadata": {"creationTimestamp": "2026-12-07T12:00:00Z"}, "spec": {"adapters": [{"name": "a"}]}}
    assert max(replan.metadata_stamps(with_inline, [adapter])) == 1796637900.0  # its adapters came with it


@pytest.mark.parametrize(
    "deployment",
    [
        None,
        {},
        {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "args": ["--max-loras", "8"]}]}}}},
        {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": ["--max-loras", "x"]}]}}}},
        {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": ["--max-loras"]}]}}}},
    ],
    ids=["absent", "empty", "no-vllm", "not-a-number", "truncated"],
)
def test_engine_flags_of_an_unreadable_deployment_are_none(deployment: Any) -> None:
    assert replan.engine_flags(deployment) is None


def test_announced_hash_reads_only_a_true_condition() -> None:
    cond = {"type": replan.CONDITION, "status": "True", "message": f"x (plan {H}) y"}
    assert replan.announced_hash({"conditions": [cond]}) == H
    assert replan.announced_hash({"conditions": [{**cond, "status": "False"}]}) is None
    assert replan.announced_hash({"conditions": [{**cond, "message": "no hash"}]}) is None
    assert replan.announced_hash(None) is None


@pytest.mark.parametrize(
    ("replan_spec", "field", "words"),
    [
        ({"policy": "Manual"}, "spec.lora.replan.policy", "must be 'Automatic' or 'Approval'"),
        ({"settleSeconds": -1}, "spec.lora.replan.settleSeconds", "must be >= 0 (got -1)"),
        ({"settleSeconds": "soon"}, "spec.lora.replan.settleSeconds", "integer"),
        ({"policy": "Automatic", "extra": 1}, "spec.lora.replan.extra", "unknown field"),
    ],
    ids=["bad-policy", "negative-window", "not-a-number", "unknown-field"],
)
def test_a_bad_replan_setting_names_the_field(replan_spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        make_pool([], replan=replan_spec)
    assert field in str(err.value) and words in str(err.value)


# --- passes over the real planner and renderer -------------------------------------------------


def make_pool(inline: list[dict[str, Any]], annotations: dict[str, str] | None = None, **lora: Any) -> LoRAPool:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml", "generation": 1, "annotations": annotations or {}},
            "spec": {
                "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
                "gpu": {"product": "A100-80GB"},
                "adapters": inline,
                "lora": lora,
            },
        }
    )
    assert isinstance(obj, LoRAPool)
    return obj


def adapter_object(name: str) -> LoRAAdapter:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"poolRef": {"name": "p"}, "source": f"hf://acme/{name}"},
        }
    )
    assert isinstance(obj, LoRAAdapter)
    return obj


@dataclass
class World:
    """What the shell keeps between passes: the applied children, the pool's status, the catalogue clock."""

    engine: dict[str, Any] | None = None
    router: dict[str, Any] | None = None
    status: dict[str, Any] = field(default_factory=dict)
    seen: Seen | None = None
    templates: list[str] = field(default_factory=list)  # each distinct engine pod template applied, in order
    events: list[decide.Event] = field(default_factory=list)

    def reconcile(self, pool: LoRAPool, ranks: Sequence[tuple[str, int]], now: float) -> decide.Decision:
        """One pass: the adapters (names and ranks; inline ones stay inline) as LoRAAdapters otherwise."""
        inline = {a.name for a in pool.spec.adapters}
        merged = merge_adapters(pool, [adapter_object(n) for n, _ in ranks if n not in inline])
        rank = dict(ranks)
        verdicts = [
            AdapterResult(a.spec.name, a.origin, rank[a.spec.name], AdapterPhase.LOADING) for a in merged.adapters
        ]
        self.seen = replan.catalogue_seen(self.seen, list(ranks), [0.0], now)  # the pool's creation, at 0
        d = decide.decide(
            pool, merged, verdicts, [], RenderOptions(), status=self.status, now=now, engine=self.engine,
            changed_at=self.seen.changed_at,
        )  # fmt: skip
        for obj in d.objects:
            if obj["kind"] == "Deployment" and obj["metadata"]["name"] == names.engine("p"):
                self.engine = obj
                template = json.dumps(obj["spec"]["template"], sort_keys=True)
                if template not in self.templates:
                    self.templates.append(template)
            if obj["kind"] == "Deployment" and obj["metadata"]["name"] == names.router("p"):
                self.router = obj
        assert d.restart is not None and d.plan is not None, d.plan_errors
        self.status = {"conditions": [d.restart.model_dump(by_alias=True, exclude_none=True)]}
        self.events += [d.restart_event] if d.restart_event else []
        return d

    def flags(self) -> Flags | None:
        return replan.engine_flags(self.engine)

    def drive(self, pool: LoRAPool, arrivals: Sequence[tuple[float, int]], until: float) -> decide.Decision:
        """Passes as the queue runs them: at each arrival (the catalogue grows to n adapters) and at each
        requeue a pass asks for (``after_s``), until ``until``; returns the last pass's decision."""
        due, d = sorted({t for t, _ in arrivals}), None
        for _ in range(100):  # a bound: a decision that requeued forever would fail here, not hang
            if not due or due[0] > until:
                break
            t = due.pop(0)
            n = [n for at, n in arrivals if at <= t][-1]
            d = self.reconcile(pool, catalogue(n), now=t)
            if d.after_s is not None:
                due = sorted({*due, t + d.after_s})
        assert d is not None
        return d


def catalogue(n: int, rank: int = 16, prefix: str = "a") -> list[tuple[str, int]]:
    return [(f"{prefix}{i:04d}", rank) for i in range(n)]


BULK = [(0.0, 0), (1.0, 8), (2.0, 60), (3.0, 120), (6.0, 1000)]  # the pool first, then its adapters over 6 s


@pytest.mark.parametrize(("settle", "templates"), [(10, 1), (0, 4)], ids=["settle-10s", "no-window"])
def test_a_bulk_apply_reaches_one_engine_template(settle: int, templates: int) -> None:
    """A pool and 1,000 adapters applied at once, reconciled as they arrive and as the queue requeues:
    one template with the window; without it, a roll per step of the estimate (8, 64, 95, 154 slots;
    issue 44 saw 3)."""
    w, pool = World(), make_pool([], replan={"settleSeconds": settle})
    d = w.drive(pool, BULK, until=60.0)
    flags = [replan.engine_flags({"spec": {"template": json.loads(x)}}) for x in w.templates]
    assert len(w.templates) == templates, flags
    if settle:  # one announcement for the whole wait, not one per pass while the catalogue arrives
        assert [e.reason for e in w.events] == [replan.CONDITION]
    assert d.restart is not None and d.restart.status == "False"
    assert d.plan is not None and flags[-1] == Flags(d.plan.max_loras, d.plan.max_lora_rank, d.plan.max_cpu_loras)


def test_the_first_template_waits_and_says_so() -> None:
    w, pool = World(), make_pool([], replan={"settleSeconds": 10})
    d = w.reconcile(pool, catalogue(3), now=0.0)
    assert w.engine is None and d.after_s == 10.0
    assert d.restart is not None and (d.restart.status, d.restart.reason) == ("True", "FirstTemplateSettling")
    assert "settleSeconds" in d.restart.message
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == names.router("p") for o in d.objects)
    assert [e.reason for e in w.events] == [replan.CONDITION]


def test_one_adapter_on_a_steady_pool_rolls_nothing() -> None:
    """5 adapters get 8 slots (spares while cheap): the 6th fits a spare; no condition, no Event."""
    w, pool = World(), make_pool([], replan={"settleSeconds": 10})
    w.reconcile(pool, catalogue(5), now=0.0)
    w.reconcile(pool, catalogue(5), now=20.0)
    before = list(w.templates)
    d = w.reconcile(pool, catalogue(6), now=30.0)
    assert w.templates == before and len(before) == 1
    assert d.restart is not None and d.restart.status == "False" and d.after_s is None
    assert [e.reason for e in w.events] == [replan.CONDITION]  # the first template's wait only


def test_growth_past_the_spare_slots_is_announced_then_rolls_once() -> None:
    """8 adapters on 8 slots; the 9th asks for 16: announced while the catalogue settles (Event, condition
    naming both flag sets), then one roll; the router Deployment stays byte-identical."""
    w, pool = World(), make_pool([], replan={"settleSeconds": 10})
    w.reconcile(pool, catalogue(8), now=0.0)
    w.reconcile(pool, catalogue(8), now=20.0)
    assert w.flags() is not None and w.flags().max_loras == 8  # type: ignore[union-attr]
    router, events = json.dumps(w.router, sort_keys=True), len(w.events)
    d = w.reconcile(pool, catalogue(9), now=30.0)
    assert w.flags().max_loras == 8 and d.after_s == 10.0  # type: ignore[union-attr]
    assert d.restart is not None and (d.restart.status, d.restart.reason) == ("True", "CatalogueSettling")
    assert "maxLoras=8" in d.restart.message and "maxLoras=16" in d.restart.message
    assert (
        d.plan is not None and d.plan.max_loras == 8 and "kept from the running engines" in d.plan.reasons["maxLoras"]
    )
    assert len(w.events) == events + 1
    w.reconcile(pool, catalogue(9), now=35.0)  # a resync inside the window: nothing new
    assert len(w.events) == events + 1 and len(w.templates) == 1
    d = w.reconcile(pool, catalogue(9), now=40.0)
    assert w.flags().max_loras == 16 and len(w.templates) == 2  # type: ignore[union-attr]
    assert d.restart is not None and d.restart.status == "False"
    assert json.dumps(w.router, sort_keys=True) == router


def test_a_rank_change_holds_the_adapter_that_needs_it() -> None:
    w, pool = World(), make_pool([], replan={"settleSeconds": 10})
    w.reconcile(pool, catalogue(4), now=0.0)
    w.reconcile(pool, catalogue(4), now=20.0)
    d = w.reconcile(pool, [*catalogue(4), ("wide", 64)], now=30.0)
    wide = next(a for a in d.adapters if a.name == "wide")
    assert wide.phase == AdapterPhase.PENDING and "--max-lora-rank 64" in wide.message
    assert "wide" not in d.identities and w.flags().max_lora_rank == 16  # type: ignore[union-attr]
    d = w.reconcile(pool, [*catalogue(4), ("wide", 64)], now=41.0)
    assert w.flags().max_lora_rank == 64 and "wide" in d.identities  # type: ignore[union-attr]


def test_approval_holds_the_restart_until_this_plan_is_approved() -> None:
    w = World()
    pool = make_pool([], replan={"settleSeconds": 0, "policy": "Approval"})
    w.reconcile(pool, catalogue(8), now=0.0)  # a first template needs no approval: nothing restarts
    assert w.flags() is not None
    d = w.reconcile(pool, catalogue(9), now=10.0)
    assert d.restart is not None and d.restart.reason == "AwaitingApproval" and d.after_s is None
    digest = replan.plan_hash(Flags(8, 16, w.flags().max_cpu_loras), Flags(16, 16, w.flags().max_cpu_loras))  # type: ignore[union-attr]
    assert f"kubectl annotate lorapool p {replan.APPROVE_ANNOTATION}={digest}" in d.restart.message
    assert w.events[-1].type == "Warning"
    stale = replan.plan_hash(Flags(8, 16, 1), Flags(32, 16, 1))
    for approved in (stale, "", digest.upper()):
        d = w.reconcile(
            make_pool(
                [], {replan.APPROVE_ANNOTATION: approved}, replan=pool.spec.lora.replan.model_dump(by_alias=True)
            ),
            catalogue(9),
            now=20.0,
        )
        assert w.flags().max_loras == 8 and d.restart is not None and d.restart.reason == "AwaitingApproval"  # type: ignore[union-attr]
    approved_pool = make_pool(
        [], {replan.APPROVE_ANNOTATION: digest}, replan={"settleSeconds": 0, "policy": "Approval"}
    )
    d = w.reconcile(approved_pool, catalogue(9), now=30.0)
    assert w.flags().max_loras == 16 and d.restart is not None and d.restart.status == "False"  # type: ignore[union-attr]


def test_automatic_with_no_window_still_announces_before_it_rolls() -> None:
    w, pool = World(), make_pool([], replan={"settleSeconds": 0})
    w.reconcile(pool, catalogue(8), now=0.0)
    d = w.reconcile(pool, catalogue(9), now=1.0)
    assert w.flags().max_loras == 8 and d.after_s == 0.0 and d.restart is not None  # type: ignore[union-attr]
    assert d.restart.reason == "Announced" and w.events[-1].reason == replan.CONDITION
    w.reconcile(pool, catalogue(9), now=1.1)
    assert w.flags().max_loras == 16  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "lora",
    [{"maxLoras": 16}, {"maxLoraRank": 64}, {"maxCpuLoras": 512}, {"maxLoras": 32, "maxLoraRank": 128}],
    ids=["max-loras", "max-lora-rank", "max-cpu-loras", "all"],
)
def test_a_replan_leaves_the_router_deployment_byte_identical(lora: dict[str, Any]) -> None:
    """The router learns slots from its live policy document (render.router), never from its own flags:
    a plan change rolls the engines only. Asserted on the rendered bytes of both Deployments."""
    before = make_pool([{"name": "sql", "source": "hf://acme/sql", "rank": 16}], maxLoras=8, maxCpuLoras=256)
    after = make_pool(
        [{"name": "sql", "source": "hf://acme/sql", "rank": 16}], **{"maxLoras": 8, "maxCpuLoras": 256, **lora}
    )

    def deployments(p: LoRAPool) -> dict[str, str]:
        served = [(a, 16) for a in merge_adapters(p, []).adapters]
        want = desired_state(p, served, RenderOptions())
        assert want.plan is not None, want.plan_errors
        return {o["metadata"]["name"]: json.dumps(o, sort_keys=True) for o in want.objects if o["kind"] == "Deployment"}

    old, new = deployments(before), deployments(after)
    assert old[names.router("p")] == new[names.router("p")]
    assert old[names.engine("p")] != new[names.engine("p")]  # the test can fail: the plan did change


def test_a_bulk_apply_to_a_running_pool_rolls_once_with_one_announcement() -> None:
    w, pool = World(), make_pool([], replan={"settleSeconds": 10})
    w.drive(pool, [(0.0, 8)], until=30.0)
    first, events = list(w.templates), len(w.events)
    arrivals = [(100.0 + t / 2, 8 + 40 * t) for t in range(1, 11)]  # 400 more adapters over 5 s
    d = w.drive(pool, [(30.0, 8), *arrivals], until=200.0)
    assert len(first) == 1 and len(w.templates) == 2
    assert len(w.events) == events + 1 and w.events[-1].reason == replan.CONDITION
    assert d.plan is not None and w.flags() == Flags(d.plan.max_loras, d.plan.max_lora_rank, d.plan.max_cpu_loras)
