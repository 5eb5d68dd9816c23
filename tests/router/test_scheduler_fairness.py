"""The scheduler with a saturation cap and fair dispatch: requests that find every replica full
wait in the router, and a flooding adapter's queue does not hold a light adapter's requests back."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from lorapool.api.traffic import Priority
from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.cli import configure, settings_from
from lorapool.router.core import registry
from lorapool.router.core.admission import HoldReason
from lorapool.router.core.fairness import CLASS_WEIGHTS, cost, estimate
from lorapool.router.core.ratelimit import Allow
from lorapool.router.scheduler import Lease, Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry
from lorapool_dev.testing.wait import wait_until_async


def pool(*, fair: bool, max_inflight: int = 1, max_prefilling: int = 0) -> Scheduler:
    """One backend with 4 LoRA slots that runs ``max_inflight`` requests at once."""
    settings = RouterSettings(
        max_wait_s=30.0, max_loras=4, max_inflight=max_inflight, max_prefilling=max_prefilling, fair_dispatch=fair
    )
    scheduler = Scheduler(registry.build("affinity"), settings, Telemetry())
    scheduler.set_backends(["http://a"])
    cards = [{"id": "base"}, *({"id": m, "parent": "base"} for m in ("flood", "light", "other"))]
    scheduler.polled(scheduler.backends()[0], VllmMetrics(), cards)
    return scheduler


async def hold(scheduler: Scheduler, model: str) -> asyncio.Task[Lease]:
    depth = scheduler.queues.depth(model)
    task = asyncio.create_task(scheduler.acquire(scheduler.request_for(model, 100, 50)))
    await wait_until_async(f"{model} held", lambda: scheduler.queues.depth(model) > depth, 5)
    return task


def test_a_request_that_finds_every_replica_full_waits_then_binds_when_one_ends() -> None:
    async def scenario() -> None:
        scheduler = pool(fair=False, max_inflight=2)
        first = await scheduler.acquire(scheduler.request_for("flood"))
        await scheduler.acquire(scheduler.request_for("light"))
        third = await hold(scheduler, "other")  # a slot is free, the replica is not
        assert scheduler.queues.depth("other") == 1 and not third.done()
        waiter = scheduler.queues.head("other")
        assert waiter is not None and waiter.reason == HoldReason.SATURATED
        scheduler.release(first)
        lease = await asyncio.wait_for(third, 5)
        assert lease.backend == "http://a" and not lease.bind.best_effort

    asyncio.run(scenario())


def test_a_prefill_cap_holds_requests_until_one_streams_its_first_token() -> None:
    async def scenario() -> None:
        scheduler = pool(fair=True, max_inflight=0, max_prefilling=2)
        state = scheduler.backends()[0]
        first = await scheduler.acquire(scheduler.request_for("flood"))
        second = await scheduler.acquire(scheduler.request_for("flood"))
        third = await hold(scheduler, "light")
        waiter = scheduler.queues.head("light")
        assert waiter is not None and waiter.reason == HoldReason.SATURATED
        scheduler.first_token(first)
        scheduler.first_token(first)  # once per lease: a second call frees nothing more
        lease = await asyncio.wait_for(third, 5)
        assert state.view().prefilling == 2 and state.inflight_total == 3
        fourth = await hold(scheduler, "other")  # the batch is not capped, the prefill queue is
        scheduler.release(second)  # ended before its first token (failed, cancelled): it frees one too
        other = await asyncio.wait_for(fourth, 5)
        for done in (first, lease, other):
            scheduler.release(done)
        assert state.view().prefilling == 0 and state.inflight_total == 0

    asyncio.run(scenario())


def test_a_moved_request_keeps_its_first_token() -> None:
    async def scenario() -> None:
        scheduler = pool(fair=False, max_inflight=0, max_prefilling=2)
        scheduler.set_backends(["http://a", "http://b"])
        a, b = sorted(scheduler.backends(), key=lambda s: s.id)
        scheduler.polled(b, VllmMetrics(), a.cards)
        lease = await scheduler.acquire(scheduler.request_for("light"))
        scheduler.first_token(lease)
        other = b if lease.backend == a.id else a
        moved = scheduler.moved(lease, other)
        assert moved.started and other.view().prefilling == 0 and other.inflight_total == 1
        scheduler.release(moved)
        assert (a.view().prefilling, b.view().prefilling) == (0, 0)

    asyncio.run(scenario())


async def drain(scheduler: Scheduler, running: Lease, tasks: list[tuple[str, asyncio.Task[Lease]]]) -> list[str]:
    """Release one request at a time (a replica running one request) and note who bound next."""
    order: list[str] = []
    scheduler.release(running)
    pending = list(tasks)
    while pending:
        done, _ = await asyncio.wait({t for _, t in pending}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, "one request ends, one binds"
        task = done.pop()
        model = next(m for m, t in pending if t is task)
        pending = [(m, t) for m, t in pending if t is not task]
        order.append(model)
        scheduler.release(task.result())
    return order


@pytest.mark.parametrize(("fair", "light_at"), [(True, 1), (False, 6)], ids=["fair dispatch", "class then age"])
def test_a_flood_queued_first_does_not_hold_back_a_light_adapter_with_fair_dispatch(fair: bool, light_at: int) -> None:
    async def scenario() -> list[str]:
        scheduler = pool(fair=fair)
        running = await scheduler.acquire(scheduler.request_for("flood", 100, 50))
        tasks = [("flood", await hold(scheduler, "flood")) for _ in range(6)]
        tasks.append(("light", await hold(scheduler, "light")))
        return await drain(scheduler, running, tasks)

    order = asyncio.run(scenario())
    # fair: the light adapter ties with the flood's counter and goes right after the flood's oldest
    # head; without it, it waits behind the whole flood
    assert order.index("light") == light_at, order


def test_fair_dispatch_charges_the_estimate_at_bind_and_settles_what_was_used() -> None:
    async def scenario() -> None:
        scheduler = pool(fair=True, max_inflight=4)
        fairness = scheduler.fairness
        assert fairness is not None
        lease = await scheduler.acquire(scheduler.request_for("light", 100, 50))
        weight = CLASS_WEIGHTS[Priority.STANDARD]
        assert lease.charged == estimate(100, 50)
        assert fairness.counter("light") == pytest.approx(estimate(100, 50) / weight)
        scheduler.release(lease, used=(120, 7))  # the engine's usage: 120 prompt, 7 completion tokens
        assert fairness.counter("light") == pytest.approx(cost(120, 7) / weight)
        start = fairness.counter("other")  # a key never charged starts at the last dispatch's counter
        assert start == pytest.approx(estimate(100, 50) / weight)
        unread = await scheduler.acquire(scheduler.request_for("other", 10, 10))
        scheduler.release(unread)  # the response was not read: the estimate stays
        assert fairness.counter("other") == pytest.approx(start + estimate(10, 10) / weight)

    asyncio.run(scenario())


def test_without_fair_dispatch_nothing_is_charged_or_metered() -> None:
    scheduler = pool(fair=False)
    assert scheduler.fairness is None
    assert not scheduler.meters(Allow())
    assert pool(fair=True).meters(Allow())


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--max-inflight", "-1"], "--max-inflight must be >= 0 requests"),
        (["--max-prefilling", "-1"], "--max-prefilling must be >= 0 requests"),
        (["--max-queue-wait", "0"], "--max-queue-wait must be > 0 seconds"),
        (["--max-queue-wait", "inf"], "--max-queue-wait must be > 0 seconds"),
    ],
)
def test_bad_saturation_flags_name_the_flag(flags: list[str], error: str) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    with pytest.raises(ValueError, match=error):
        settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1", *flags]))


def test_the_flags_reach_the_settings() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    flags = ["--max-inflight", "8", "--max-prefilling", "3", "--max-queue-wait", "5", "--fair-dispatch"]
    settings = settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1", *flags]))
    assert (settings.max_inflight, settings.max_prefilling, settings.max_queue_wait_s) == (8, 3, 5.0)
    assert settings.fair_dispatch
    defaults = settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1"]))
    assert (defaults.max_inflight, defaults.max_prefilling, defaults.fair_dispatch) == (0, 0, False)


@pytest.mark.parametrize("fair", [True, False], ids=["fair dispatch", "class then age"])
def test_a_flood_far_ahead_of_an_adapter_waiting_for_a_slot_lets_its_slot_drain(fair: bool) -> None:
    async def scenario() -> None:
        settings = RouterSettings(max_wait_s=30.0, max_loras=2, fair_dispatch=fair)
        scheduler = Scheduler(registry.build("affinity"), settings, Telemetry())
        scheduler.set_backends(["http://a"])
        cards = [{"id": "base"}, *({"id": m, "parent": "base"} for m in ("flood", "light", "other"))]
        scheduler.polled(scheduler.backends()[0], VllmMetrics(), cards)
        flood = [await scheduler.acquire(scheduler.request_for("flood", 100, 50))]
        other = await scheduler.acquire(scheduler.request_for("other", 100, 50))  # both slots taken
        light = await hold(scheduler, "light")
        if not fair:  # nothing orders slots: the flood keeps its slot as long as it sends
            for _ in range(8):
                flood.append(await asyncio.wait_for(scheduler.acquire(scheduler.request_for("flood", 100, 50)), 5))
            assert not light.done()
            return
        # each bind is 100 weighted tokens: flood 100, other 200; light waits from the last bind's
        # counter (200), so the flood binds (200, 300, 400, 500) until it is more than the bound
        # (2 x 100) ahead of light, then waits too
        for _ in range(4):
            flood.append(await asyncio.wait_for(scheduler.acquire(scheduler.request_for("flood", 100, 50)), 5))
        late = await hold(scheduler, "flood")
        waiter = scheduler.queues.head("flood")
        assert waiter is not None and waiter.reason == HoldReason.FAIR
        for lease in flood:  # the flood's slot drains: light takes it, the flood waits for the next
            scheduler.release(lease)
        bound = await asyncio.wait_for(light, 5)
        assert bound.backend == "http://a" and not late.done()
        scheduler.release(other)
        assert (await asyncio.wait_for(late, 5)).backend == "http://a"

    asyncio.run(scenario())
