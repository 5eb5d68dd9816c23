"""Several router processes sharing their books through a real Redis (issue 43): a slot one router
claimed is not taken by another, a client pinned to one router gets the pool's rate limit, a router
killed under load leaves the books within its TTL, and a store that dies or is cut off from some
routers stops no request. The routers poll the engines every 30 s here, so what one router knows of
another's requests can only have come through the books."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from lorapool.api.traffic import RateLimits
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.redisstore import Gate, RedisStore
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import StartRouter, StartSim
from .test_ratelimit_process import completion, write
from .test_router_process import client, post

pytestmark = pytest.mark.timeout(120)

INTERVAL = "0.2"  # heartbeat and resync: a silent router's books expire after 0.8 s


@pytest.fixture
def store() -> Iterator[RedisStore]:
    with RedisStore() as running:
        yield running


def shared(url: str, key: str = "pool-uid", *extra: str) -> list[str]:
    return ["--shared-state", url, "--shared-state-key", key, "--shared-state-interval", INTERVAL,
            "--poll-interval", "30", *extra]  # fmt: skip


def gauge(router: str, name: str) -> float | None:
    return metric(scrape(router), name)


def peers_are(routers: list[str], n: int) -> bool:
    return all(gauge(r, "lorapool_router_shared_books_peers") == n for r in routers)


def decisions(router: str, kind: str) -> float:
    return metric(scrape(router), "lorapool_router_decisions_total", kind=kind) or 0.0


class LongStream:
    """A streamed completion held open through ``router`` (``ignore_eos``: it runs its max_tokens)."""

    def __init__(self, router: str, model: str) -> None:
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.stream = client(router).completions.create(
            model=model, prompt="x", max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.started.wait(10), "the stream's first chunk"

    def _read(self) -> None:
        try:
            for _ in self.stream:
                self.started.set()
        except (openai.APIError, OSError) as exc:
            self.error = exc
        self.started.set()

    def close(self) -> None:
        self.stream.close()
        self.thread.join(10)


def test_a_slot_one_router_claimed_is_not_taken_by_another(
    start_sim: StartSim, start_router: StartRouter, store: RedisStore
) -> None:
    sim = start_sim(max_loras=1)
    a, b = (start_router([sim], extra=shared(store.url)) for _ in range(2))
    alone = start_router([sim], extra=["--poll-interval", "30"])  # its own books: the control
    wait_until("a and b see each other", lambda: peers_are([a, b], 1), 10)
    held = LongStream(a, "sql")  # sql takes the replica's one LoRA slot, through a
    try:
        # b heard a's claim: chat waits for the slot (held) instead of thrashing it.
        wait_until("b counts a's request", lambda: _peer_load_seen(b, store), 5)
        answer: dict[str, int] = {}
        asked = threading.Thread(target=lambda: answer.update(code=post(b, completion("chat"))[0]), daemon=True)
        asked.start()
        wait_until("b held chat", lambda: decisions(b, "queued") == 1, 10)
        assert decisions(b, "free_slot") + decisions(b, "miss") == 0
        # The lone router knows only its own books: it binds chat onto the taken slot at once.
        assert post(alone, completion("chat"))[0] == 200 and decisions(alone, "queued") == 0
    finally:
        held.close()
    asked.join(30)
    assert answer.get("code") == 200  # the slot freed: b bound chat


def _peer_load_seen(router: str, store: RedisStore) -> bool:
    """The router heard a peer's entry with a request in flight (the store holds what it heard)."""
    import redis

    entries = redis.Redis.from_url(store.url).hvals("lorapool:{pool-uid}:books")
    busy = any(json.loads(e)["b"] for e in entries)
    return busy and gauge(router, "lorapool_router_shared_books_peers") == 1


def test_a_client_pinned_to_one_router_gets_the_pools_limit_and_three_spread_get_no_more(
    start_sim: StartSim, start_router: StartRouter, store: RedisStore, tmp_path: Path
) -> None:
    # 10 requests/s for the pool (burst 3), written for 3 routers as the operator writes it.
    limits = write(tmp_path / "traffic.json", routers=3, sql=RateLimits(requests_per_second=10, burst_requests=3))
    sim = start_sim(time_scale=0)
    routers = [start_router([sim], extra=[*shared(store.url), "--traffic-file", str(limits)]) for _ in range(3)]
    wait_until("the three see each other", lambda: peers_are(routers, 2), 10)

    def admitted(targets: list[str], seconds: float) -> int:
        end, n, i = time.monotonic() + seconds, 0, 0
        while time.monotonic() < end:
            n += post(targets[i % len(targets)], completion("sql"))[0] == 200
            i += 1
            time.sleep(0.01)
        return n

    # Pinned to one router (one keep-alive connection through a Service): its share follows its
    # demand, so it admits about the pool's 10/s; its own books alone would give 10/3 a second.
    pinned = admitted(routers[:1], 4.0)
    assert 28 <= pinned <= 46, pinned  # ~40 = 4 s x 10/s (+ a burst's share); 1/3 of it without the books
    # Spread over the three: the shares follow the demand and sum to one; never 3x the limit.
    spread = admitted(routers, 4.0)
    assert 28 <= spread <= 50, spread


def test_a_router_killed_under_load_ends_its_requests_and_its_claims_expire(
    start_sim: StartSim, start_router: StartRouter, store: RedisStore, processes: dict[str, RunningProcess]
) -> None:
    sim = start_sim(max_loras=1)
    routers = [start_router([sim], extra=shared(store.url)) for _ in range(3)]
    wait_until("the three see each other", lambda: peers_are(routers, 2), 10)
    doomed = LongStream(routers[2], "sql")  # its claim: sql in the one slot
    code: dict[str, int] = {}
    waiting = threading.Thread(target=lambda: code.update(status=post(routers[0], completion("code"))[0]), daemon=True)
    waiting.start()
    wait_until("router 0 holds code behind router 2's claim", lambda: decisions(routers[0], "queued") == 1, 10)
    killed_at = time.monotonic()
    processes[routers[2]].popen.kill()
    doomed.thread.join(10)
    assert doomed.error is not None and time.monotonic() - killed_at < 10  # a clean error, never a hang
    # Its entry expires on the store's clock; the others drop its claim and carry on.
    wait_until("the others lost it", lambda: peers_are(routers[:2], 1), 5)
    waiting.join(30)
    assert code.get("status") == 200  # the claim expired: router 0 bound code
    assert post(routers[1], completion("chat"))[0] == 200


def test_the_store_killed_mid_run_stops_no_request_and_is_used_again_when_back(
    start_sim: StartSim, start_router: StartRouter, store: RedisStore
) -> None:
    sim = start_sim(time_scale=0)
    a, b = (start_router([sim], extra=shared(store.url)) for _ in range(2))
    wait_until("a and b see each other", lambda: peers_are([a, b], 1), 10)
    store.kill()
    wait_until("both say the store is down", lambda: all(gauge(r, "lorapool_router_shared_books_up") == 0 for r in (a, b)), 5)  # fmt: skip
    wait_until("their peers expired", lambda: peers_are([a, b], 0), 5)
    assert [post(r, completion(m))[0] for r in (a, b) for m in ("sql", "chat")] == [200] * 4
    assert metric(scrape(a), "lorapool_router_shared_books_local_decisions_total") == 2
    store.start()
    wait_until("both share again", lambda: peers_are([a, b], 1), 10)
    assert all(gauge(r, "lorapool_router_shared_books_up") == 1 for r in (a, b))


def test_a_partition_cuts_only_the_router_that_lost_the_store(
    start_sim: StartSim, start_router: StartRouter, store: RedisStore
) -> None:
    gate = Gate(store.port)
    try:
        sim = start_sim(time_scale=0)
        cut = start_router([sim], extra=shared(f"redis://127.0.0.1:{gate.port}/0"))
        others = [start_router([sim], extra=shared(store.url)) for _ in range(2)]
        wait_until("all three see each other", lambda: peers_are([cut, *others], 2), 10)
        gate.close()
        wait_until("the cut router decides alone", lambda: peers_are([cut], 0), 5)
        wait_until("the others see each other only", lambda: peers_are(others, 1), 5)
        assert gauge(cut, "lorapool_router_shared_books_up") == 0
        assert post(cut, completion("sql"))[0] == 200 and post(others[0], completion("sql"))[0] == 200
        gate.open()
        wait_until("healed", lambda: peers_are([cut, *others], 2), 10)
    finally:
        gate.shutdown()


def test_an_acl_user_from_the_environment_and_a_wrong_password_never_logged(
    start_sim: StartSim, start_router: StartRouter, processes: dict[str, RunningProcess]
) -> None:
    with RedisStore(user="router", password="s3cret-pw") as store:
        sim = start_sim(time_scale=0)
        url = f"redis://127.0.0.1:{store.port}/0"
        env = {"LORAPOOL_SHARED_STATE_USERNAME": "router", "LORAPOOL_SHARED_STATE_PASSWORD": "s3cret-pw"}
        good = start_router([sim], extra=shared(url), env=env)
        bad = start_router([sim], extra=shared(url), env={**env, "LORAPOOL_SHARED_STATE_PASSWORD": "wrong-pw"})
        wait_until("the good one shares", lambda: gauge(good, "lorapool_router_shared_books_up") == 1, 10)
        wait_until("the bad one says down", lambda: (metric(scrape(bad), "lorapool_router_shared_books_errors_total", op="write") or 0) > 0, 10)  # fmt: skip
        assert gauge(bad, "lorapool_router_shared_books_up") == 0
        assert post(bad, completion("sql"))[0] == 200  # it routes from its own books
        log = processes[bad].output()
        assert "Shared books unreachable" in log or "Sharing the books" in log
        assert "wrong-pw" not in log and "s3cret-pw" not in processes[good].output()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"shared_state": "http://127.0.0.1:6379"}, "--shared-state must be redis://"),
        ({"shared_state": "redis://"}, "--shared-state must be redis://"),
        ({"shared_state": "redis://h:99999/0"}, "--shared-state must be redis://"),
        ({"shared_state": "redis://h/x"}, "--shared-state must be redis://"),
        ({"shared_state_key": "a}b"}, "--shared-state-key"),
        ({"shared_state_interval_s": 0}, "--shared-state-interval"),
        ({"shared_state_deadline_s": float("inf")}, "--shared-state-deadline"),
    ],
)
def test_bad_shared_state_flags_name_the_flag(flags: dict[str, Any], says: str) -> None:
    from lorapool.router.settings import RouterSettings

    with pytest.raises(ValueError, match=says):
        RouterSettings(**flags)
    assert RouterSettings(shared_state="rediss://books.ml.svc:6380/2").shared_state  # a good one passes


def in_process_routers(store: RedisStore, count: int = 2) -> tuple[list[Any], list[Any]]:
    """``count`` schedulers over one engine with 1 LoRA slot, each with its SharedBooks on ``store``
    and its loops not run: the test says when each writes and reads."""
    from lorapool.api.vllm_metrics import VllmMetrics
    from lorapool.router.core import registry
    from lorapool.router.scheduler import Scheduler
    from lorapool.router.settings import RouterSettings
    from lorapool.router.sharedbooks import SharedBooks
    from lorapool.router.telemetry import Telemetry

    books, schedulers = [], []
    for port in range(1, count + 1):
        settings = RouterSettings(port=port, max_loras=1, max_wait_s=30, shared_state=store.url)
        scheduler = Scheduler(registry.build("affinity"), settings, Telemetry())
        scheduler.set_backends(["http://engine"])
        cards = [{"id": "base"}, *({"id": m, "parent": "base"} for m in ("sql", "chat", "code"))]
        scheduler.polled(scheduler.backends()[0], VllmMetrics(), cards)
        books.append(SharedBooks(settings, scheduler, Telemetry()))
        schedulers.append(scheduler)
    return books, schedulers


def test_two_routers_that_have_not_heard_each_other_cannot_both_take_the_last_slot(store: RedisStore) -> None:
    """The claim is atomic in the store: router b binds chat onto the one free slot it believes it
    sees, but a's claim for sql took that slot first (b never heard a's publish), so b's bind is
    undone and b holds chat until the slot frees: one adapter in the slot, never two."""
    from lorapool.router.core.admission import HoldReason
    from lorapool_dev.testing.wait import wait_until_async

    async def scenario() -> None:
        books, (a, b) = in_process_routers(store)
        for keeper in books:
            await keeper.write()  # both up, each with an empty entry in the store
        assert a.books_up and b.books_up
        sql = await a.acquire(a.request_for("sql"))  # a claims the slot
        held = asyncio.create_task(b.acquire(b.request_for("chat")))
        await wait_until_async("b holds chat", lambda: b.queues.depth("chat") == 1, 5)
        waiter = b.queues.head("chat")
        assert waiter is not None and waiter.reason == HoldReason.SLOT
        assert b.backends()[0].view().active.keys() == {"sql"}  # the claim's answer: a's books
        a.release(sql)
        await books[0].write()  # a's books without sql, as its writer would store them
        await books[1].resync()  # b reads them (its subscription would have heard them first)
        chat = await asyncio.wait_for(held, 5)
        assert chat.backend == "http://engine"
        assert await books[0].claim("http://engine", "x", 1, []) is False  # b's claim of chat holds the slot now
        for keeper in books:
            await keeper.client.aclose()

    asyncio.run(scenario())


def test_a_freed_slot_goes_to_the_oldest_held_request_of_the_pool_not_of_the_router(store: RedisStore) -> None:
    """b frees the slot while a holds an older request than b's own: b lets a's go first (for
    PEER_GRACE_S at most), a binds it, and b's stays held, as one router's FIFO would have it."""
    from lorapool_dev.testing.wait import wait_until_async

    async def scenario() -> None:
        books, (a, b) = in_process_routers(store)
        sql = await b.acquire(b.request_for("sql"))  # b's request takes the one slot
        for keeper in (books[1], books[0]):
            await keeper.write()
            await keeper.resync()
        older = asyncio.create_task(a.acquire(a.request_for("chat")))
        await wait_until_async("a holds chat", lambda: a.queues.depth("chat") == 1, 5)
        await books[0].write()
        newer = asyncio.create_task(b.acquire(b.request_for("code")))
        await wait_until_async("b holds code", lambda: b.queues.depth("code") == 1, 5)
        await books[1].resync()  # b knows a's head: chat, older than its code
        b.release(sql)  # the slot frees at b
        assert b.queues.depth("code") == 1 and not newer.done()  # b lets a's older request go first
        await books[1].write()
        await books[0].resync()  # a hears the free slot
        assert (await asyncio.wait_for(older, 5)).req.model == "chat"
        await books[1].resync()
        await asyncio.sleep(0.1)  # past PEER_GRACE_S: b tries, and a's claim holds the slot
        assert b.queues.depth("code") == 1 and not newer.done()
        newer.cancel()
        for keeper in books:
            await keeper.client.aclose()

    asyncio.run(scenario())
