"""The scheduler takes a re-read policy document's dispatch knobs and slots between two decisions:
new caps and slots count for the next binds, a held request keeps its hold, fair dispatch turns on
and off. ``Scheduler.set_policy`` is what ``--policy-file``'s re-read calls."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.core import registry
from lorapool.router.core.admission import HoldReason
from lorapool.router.core.backend import DecisionKind
from lorapool.router.core.ratelimit import Allow
from lorapool.router.scheduler import Lease, Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry
from lorapool_dev.testing.wait import wait_until_async

ADAPTERS = ("a", "b", "c", "d")


def pool(**settings: object) -> Scheduler:
    """One backend serving ADAPTERS, the knobs from the flags' settings (as without a document)."""
    scheduler = Scheduler(registry.build("affinity"), RouterSettings(**settings), Telemetry())  # type: ignore[arg-type]
    scheduler.set_backends(["http://a"])
    cards = [{"id": "base"}, *({"id": m, "parent": "base"} for m in ADAPTERS)]
    scheduler.polled(scheduler.backends()[0], VllmMetrics(), cards)
    return scheduler


def reread(scheduler: Scheduler, **knobs: object) -> None:
    """What a re-read document with these knobs does: the same chain, new knobs."""
    scheduler.set_policy(scheduler.scheduling, replace(scheduler.knobs, **knobs))  # type: ignore[arg-type]


async def hold(scheduler: Scheduler, model: str) -> asyncio.Task[Lease]:
    depth = scheduler.queues.depth(model)
    task = asyncio.create_task(scheduler.acquire(scheduler.request_for(model, 100, 50)))
    await wait_until_async(f"{model} held", lambda: scheduler.queues.depth(model) > depth, 5)
    return task


def test_a_lower_inflight_cap_holds_the_next_request_and_a_higher_one_binds_it() -> None:
    async def scenario() -> None:
        scheduler = pool(max_wait_s=30.0, max_loras=4)  # no cap
        first = await scheduler.acquire(scheduler.request_for("a"))
        await scheduler.acquire(scheduler.request_for("a"))
        reread(scheduler, max_inflight=2)
        third = await hold(scheduler, "b")  # a slot is free, the replica is at its new cap
        waiter = scheduler.queues.head("b")
        assert waiter is not None and waiter.reason == HoldReason.SATURATED
        scheduler.release(first)
        assert (await asyncio.wait_for(third, 5)).backend == "http://a"
        fourth = await hold(scheduler, "c")
        reread(scheduler, max_inflight=0)  # the cap lifted: the held request binds at once
        assert not (await asyncio.wait_for(fourth, 5)).bind.best_effort

    asyncio.run(scenario())


def test_fewer_slots_hold_a_new_adapter_until_one_frees() -> None:
    async def scenario() -> None:
        scheduler = pool(max_wait_s=30.0, max_loras=4)
        first = await scheduler.acquire(scheduler.request_for("a"))
        await scheduler.acquire(scheduler.request_for("b"))
        assert scheduler.backends()[0].view().max_loras == 4
        reread(scheduler, max_loras=2, max_cpu_loras=8)
        assert scheduler.backends()[0].view().max_loras == 2
        third = await hold(scheduler, "c")  # both of the 2 slots run an adapter
        waiter = scheduler.queues.head("c")
        assert waiter is not None and waiter.reason == HoldReason.SLOT
        scheduler.release(first)
        lease = await asyncio.wait_for(third, 5)
        assert lease.kind == DecisionKind.FREE_SLOT and not lease.bind.best_effort  # the slot a freed

    asyncio.run(scenario())


def test_what_an_engine_reports_still_wins_over_the_documents_slots() -> None:
    scheduler = pool(max_loras=4)
    scheduler.polled(scheduler.backends()[0], VllmMetrics(max_loras=6), [{"id": "base"}])
    reread(scheduler, max_loras=2)
    assert scheduler.backends()[0].view().max_loras == 6


def test_a_held_request_keeps_its_wait_and_new_ones_get_the_new_one() -> None:
    async def scenario() -> None:
        scheduler = pool(max_wait_s=30.0, max_loras=1)
        await scheduler.acquire(scheduler.request_for("a"))  # the one slot
        held = await hold(scheduler, "b")
        reread(scheduler, max_wait_s=0.05)
        await asyncio.sleep(0.3)
        assert not held.done()  # held for its 30 s
        lease = await asyncio.wait_for(scheduler.acquire(scheduler.request_for("c")), 5)
        assert lease.bind.best_effort and lease.waited_s < 5  # waited the new 0.05 s, then best effort
        held.cancel()

    asyncio.run(scenario())


def test_fair_dispatch_turns_on_and_off() -> None:
    scheduler = pool()
    assert scheduler.fairness is None and not scheduler.meters(Allow())
    reread(scheduler, fair=True)
    counter = scheduler.fairness
    assert counter is not None and scheduler.meters(Allow())
    reread(scheduler, fair=True, max_inflight=3)
    assert scheduler.fairness is counter  # other knobs changed: the counters stay
    reread(scheduler, fair=False)
    assert scheduler.fairness is None and not scheduler.meters(Allow())


def test_no_knobs_keep_the_ones_in_force() -> None:
    scheduler = pool(max_inflight=3, fair_dispatch=True)
    knobs, counter = scheduler.knobs, scheduler.fairness
    scheduler.set_policy(registry.build("least-loaded"))
    assert scheduler.knobs == knobs and scheduler.fairness is counter
    assert scheduler.backends()[0].view().capacity == 3


def test_an_engines_404_for_an_adapter_the_pool_has_is_retried_not_passed_on() -> None:
    """During a roll an engine can answer 404 for an adapter its report (or /v1/models) said it held:
    with the pool's adapter set read, that 404 is the router's to absorb (retry, then hold or 503);
    without the set, or for a name the pool lacks, it is the client's answer, as before."""

    async def scenario() -> None:
        scheduler = pool()
        lease = await scheduler.acquire(scheduler.request_for("a"))
        assert lease.req.in_pool is None and not scheduler.model_missing(lease)  # no set: passed on
        scheduler.set_desired(frozenset({"b"}))
        lease = await scheduler.acquire(scheduler.request_for("b"))
        assert lease.req.in_pool is True and scheduler.model_missing(lease)  # the pool has it: retried
        scheduler.release(lease)
        lease = await scheduler.acquire(scheduler.request_for("c"))
        assert lease.req.in_pool is False and not scheduler.model_missing(lease)  # not the pool's: a 404

    asyncio.run(scenario())
