"""When the reconcile queue runs a pool (controller.schedule): scripts of triggers and outcomes on one
pool, replayed over the pure schedule, and the times its runs start; then the asyncio shell once."""

from __future__ import annotations

import asyncio
import math

import pytest

from lorapool.controller import schedule
from lorapool.controller.schedule import DONE, QueueSettings, Result, Schedule, backoff_s
from lorapool.controller.workqueue import WorkQueue
from lorapool_dev.testing.wait import wait_until_async

KEY = ("ml", "p")
SETTINGS = QueueSettings(window_s=2.0, backoff_base_s=2.0, backoff_max_s=16.0, resync_s=60.0)

OUTCOMES: dict[str, Result | None] = {
    "ok": DONE,
    "error": None,
    "requeue": Result(requeue=True),
    "requeue 5s": Result(requeue=True, after_s=5.0),
    "gone": Result(forget=True),
}


def apply(s: Schedule, op: str, now: float) -> Schedule:
    entry = s.entries.get(KEY)
    if op == "add":
        return s.put(KEY, schedule.trigger(entry, now))
    if op == "windowed":
        return s.put(KEY, schedule.trigger_windowed(entry, now, SETTINGS.window_s))
    if op == "forget":
        return s.forget(KEY)
    assert entry is not None and entry.running, f"{op} at {now}: no run to finish"
    return s.put(KEY, schedule.finish(entry, OUTCOMES[op], now, SETTINGS))


def replay(script: list[tuple[float, str]], until: float) -> list[float]:
    """The start times of the pool's runs: each step applies the next event or wakes when the schedule asks."""
    s, runs, events = Schedule({}, resync_at=SETTINGS.resync_s), [], sorted(script)
    while True:
        event_at = events[0][0] if events else math.inf
        now = min(event_at, schedule.next_wake(s))
        if now > until:
            return runs
        if event_at <= now:
            s = apply(s, events.pop(0)[1], now)
        s, ready = schedule.start(s, now, SETTINGS)
        runs += [now for _ in ready]


SCRIPTS = [
    pytest.param([(0, "add")], 10, [0], id="a trigger runs at once"),
    pytest.param([(0, "add"), (0.1, "add"), (0.2, "add"), (1, "ok")], 10, [0, 1],
                 id="a burst while it runs folds into one run after it"),
    pytest.param([(0, "add"), (1, "ok"), (5, "add"), (6, "ok")], 10, [0, 5], id="triggers while idle run each"),
    pytest.param([(0, "windowed"), (0.5, "ok"), (0.5, "windowed"), (1, "windowed"), (1.5, "windowed")], 10, [0, 2],
                 id="windowed: the first at once, the rest once at the window's end"),
    pytest.param([(0, "windowed"), (0.5, "ok"), (3, "windowed")], 10, [0, 3],
                 id="windowed after a quiet window: at once"),
    pytest.param([(0, "windowed"), (0.5, "ok"), (1, "add")], 10, [0, 1],
                 id="a plain trigger does not wait for the pods' window"),
    pytest.param([(0, "add"), (1, "error"), (3.5, "error"), (8, "error")], 20, [0, 3, 7.5, 16],
                 id="an error retries after a backoff that doubles"),
    pytest.param([(0, "add"), (1, "error"), (1.5, "add"), (2, "windowed")], 10, [0, 3],
                 id="triggers during the backoff fold into the retry"),
    pytest.param([(0, "add"), (1, "error"), (3.5, "ok"), (4, "add"), (4.5, "error")], 10, [0, 3, 4, 6.5],
                 id="a success resets the backoff"),
    pytest.param([(0, "add"), (1, "requeue")], 10, [0, 1], id="a requeue runs again at once"),
    pytest.param([(0, "add"), (1, "requeue 5s")], 10, [0, 6], id="a requeue after_s runs again that much later"),
    pytest.param([(0, "add"), (0.5, "add"), (1, "requeue 5s")], 10, [0, 1],
                 id="a trigger during the run wins over a later requeue"),
    pytest.param([(0, "add"), (1, "ok"), (61, "ok"), (121, "ok")], 130, [0, 60, 120], id="the resync runs a known pool"),
    pytest.param([(0, "add"), (1, "ok"), (2, "forget")], 130, [0], id="a deleted pool is not resynced"),
    pytest.param([(0, "add"), (1, "gone")], 130, [0], id="a reconcile that finds the pool gone stops its resync"),
    pytest.param([(0, "add"), (1, "gone"), (10, "add"), (11, "ok")], 70, [0, 10, 60],
                 id="a trigger after it was forgotten makes it known again"),
]  # fmt: skip


@pytest.mark.parametrize(("script", "until", "runs"), SCRIPTS)
def test_runs(script: list[tuple[float, str]], until: float, runs: list[float]) -> None:
    assert replay(script, until) == runs


@pytest.mark.parametrize(("failures", "wait_s"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 16.0), (9, 16.0)])
def test_backoff_doubles_up_to_its_cap(failures: int, wait_s: float) -> None:
    assert backoff_s(failures, SETTINGS) == wait_s


def test_a_forgotten_idle_pool_leaves_the_schedule() -> None:
    s, _ = schedule.start(Schedule({}, 60.0).put(KEY, schedule.trigger(None, 0.0)), 0.0, SETTINGS)
    s = s.put(KEY, schedule.finish(s.entries[KEY], Result(forget=True), 1.0, SETTINGS))
    assert s.entries == {}


def test_pools_run_side_by_side_one_run_each() -> None:
    s = Schedule({}, 60.0).put(("ml", "b"), schedule.trigger(None, 0.0)).put(KEY, schedule.trigger(None, 0.0))
    s, ready = schedule.start(s, 0.0, SETTINGS)
    assert ready == (("ml", "b"), KEY)
    assert schedule.start(s.put(KEY, schedule.trigger(s.entries[KEY], 0.1)), 0.1, SETTINGS)[1] == ()


def test_the_work_queue_runs_retries_and_requeues() -> None:
    calls: list[tuple[str, str]] = []
    outcomes: list[Result | Exception] = [RuntimeError("API server down"), Result(requeue=True), DONE]

    async def reconcile(namespace: str, name: str) -> Result:
        calls.append((namespace, name))
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def main() -> None:
        queue = WorkQueue(reconcile, QueueSettings(window_s=0.05, backoff_base_s=0.05, resync_s=100.0))
        runner = asyncio.create_task(queue.run())
        queue.add(*KEY)
        await wait_until_async("three reconciles", lambda: not outcomes, 10)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner

    asyncio.run(main())
    assert calls == [KEY, KEY, KEY]
