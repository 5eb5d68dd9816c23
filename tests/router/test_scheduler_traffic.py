"""The scheduler and the adapters' traffic classes: each request stamped with its class, held
requests bound by class before age, sheddable ones shed first when the queues are full."""

from __future__ import annotations

import asyncio

import pytest

from lorapool.api.traffic import AdapterTraffic, Priority, TrafficPolicy
from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.core import registry
from lorapool.router.core.admission import RefusalReason
from lorapool.router.scheduler import Lease, Refused, Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry
from lorapool_dev.testing.wait import wait_until_async


def test_request_for_carries_the_adapters_priority() -> None:
    scheduler = Scheduler(registry.build("affinity"), RouterSettings(), Telemetry())
    assert scheduler.request_for("sql").priority == Priority.STANDARD  # no document yet: the default
    scheduler.traffic = TrafficPolicy(adapters={"sql": AdapterTraffic(priority=Priority.CRITICAL)})
    assert scheduler.request_for("sql").priority == Priority.CRITICAL
    assert scheduler.request_for("chat").priority == Priority.STANDARD


def full_pool(max_queued: int = 100) -> Scheduler:
    """One backend with one LoRA slot, taken by 'sql': every other adapter's request is held."""
    settings = RouterSettings(max_wait_s=10.0, max_loras=1, max_queued=max_queued)
    scheduler = Scheduler(registry.build("affinity"), settings, Telemetry())
    scheduler.set_backends(["http://a"])
    cards = [{"id": "base"}, *({"id": m, "parent": "base"} for m in ("sql", "chat", "code", "bulk", "misc"))]
    scheduler.polled(scheduler.backends()[0], VllmMetrics(), cards)
    scheduler.set_traffic(
        TrafficPolicy(
            adapters={
                "code": AdapterTraffic(priority=Priority.CRITICAL),
                "bulk": AdapterTraffic(priority=Priority.SHEDDABLE),
                "misc": AdapterTraffic(priority=Priority.SHEDDABLE),
            }
        )
    )
    return scheduler


async def held(scheduler: Scheduler, model: str) -> asyncio.Task[Lease]:
    task = asyncio.create_task(scheduler.acquire(scheduler.request_for(model)))
    await wait_until_async(f"{model} held", lambda: scheduler.queues.depth(model) >= 1, 5)
    return task


def test_a_critical_adapters_held_request_binds_before_older_standard_ones() -> None:
    async def scenario() -> list[str]:
        scheduler = full_pool()
        running = await scheduler.acquire(scheduler.request_for("sql"))
        chat = await held(scheduler, "chat")  # standard, first in
        code = await held(scheduler, "code")  # critical, later
        order: list[str] = []
        for task in (chat, code):
            task.add_done_callback(lambda t: order.append(t.result().req.model))
        scheduler.release(running)  # the slot frees: the critical one takes it
        first = await asyncio.wait_for(code, 5)
        assert not chat.done()
        scheduler.release(first)
        scheduler.release(await asyncio.wait_for(chat, 5))
        return order

    assert asyncio.run(scenario()) == ["code", "chat"]


def test_full_queues_shed_the_newest_sheddable_request_for_a_more_important_one() -> None:
    async def scenario() -> None:
        scheduler = full_pool(max_queued=3)
        running = await scheduler.acquire(scheduler.request_for("sql"))
        bulk = await held(scheduler, "bulk")
        misc = await held(scheduler, "misc")
        chat = await held(scheduler, "chat")
        code = await held(scheduler, "code")  # full: 'misc' (the newest sheddable) makes room
        with pytest.raises(Refused) as shed:
            await asyncio.wait_for(misc, 5)
        assert shed.value.refusal.reason == RefusalReason.SHED and shed.value.refusal.status == 503
        assert "'misc' is sheddable" in shed.value.refusal.message
        assert not bulk.done() and scheduler.queues.depth("code") == 1
        # a sheddable request never sheds another: the queues are full, it gets 429
        with pytest.raises(Refused) as full:
            await scheduler.acquire(scheduler.request_for("misc"))
        assert full.value.refusal.reason == RefusalReason.QUEUE_FULL and full.value.refusal.status == 429
        page = scheduler.telemetry.exposition().decode()
        assert 'lorapool_router_adapter_shed_total{adapter="misc"} 1.0' in page
        for task in (bulk, chat, code):
            task.cancel()
        await asyncio.gather(bulk, chat, code, return_exceptions=True)
        scheduler.release(running)

    asyncio.run(scenario())


def test_without_priorities_held_requests_bind_oldest_first_as_before() -> None:
    async def scenario() -> list[str]:
        scheduler = full_pool()
        scheduler.set_traffic(TrafficPolicy())
        running = await scheduler.acquire(scheduler.request_for("sql"))
        code = await held(scheduler, "code")
        chat = await held(scheduler, "chat")
        scheduler.release(running)
        first = await asyncio.wait_for(code, 5)
        assert not chat.done()
        scheduler.release(first)
        scheduler.release(await asyncio.wait_for(chat, 5))
        return [first.req.model]

    assert asyncio.run(scenario()) == ["code"]


def test_set_policy_swaps_the_policy_between_decisions() -> None:
    """A re-read policy document: the new policy decides from the next decision on; a request held
    under the old one still waits and binds when its slot frees."""

    async def scenario() -> None:
        scheduler = full_pool()
        running = await scheduler.acquire(scheduler.request_for("sql"))
        chat = await held(scheduler, "chat")  # affinity holds it: the only slot is taken
        scheduler.set_policy(registry.build("round-robin"))
        code = await asyncio.wait_for(scheduler.acquire(scheduler.request_for("code")), 5)  # never held now
        assert code.backend == "http://a" and not chat.done()
        scheduler.release(running)
        scheduler.release(code)
        bound = await asyncio.wait_for(chat, 5)
        scheduler.release(bound)
        assert scheduler.backends()[0].inflight_total == 0 and not scheduler.queues

    asyncio.run(scenario())
