"""The reconcile queue's asyncio loop. Thin shell over ``controller.schedule``.

``controller.app`` wires kopf's watch handlers to ``add`` / ``add_windowed`` / ``forget`` and runs
``run``; every decision (when a pool runs, coalescing, backoff, resync) is ``controller.schedule``'s.
Each pool's reconcile runs in its own task, one at a time per pool, pools side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from prometheus_client import Counter, Histogram

from lorapool.controller import schedule
from lorapool.controller.schedule import Key, QueueSettings, Result, RetryLater, Schedule

log = logging.getLogger("lorapool.operator")

RECONCILES = Counter("lorapool_operator_reconciles_total", "Pool reconciles", ["result"])
DURATION = Histogram(
    "lorapool_operator_reconcile_duration_seconds",
    "Time to reconcile one pool",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

Reconcile = Callable[[str, str], Awaitable[Result]]  # async (namespace, name) -> Result
T = TypeVar("T")
R = TypeVar("R")


async def bounded_map(fn: Callable[[T], Awaitable[R]], items: Sequence[T], limit: int) -> list[R]:
    """``fn`` over ``items``, ``limit`` at a time, results in order. ``limit`` workers take the next item
    in turn: at 10,000 adapters a gather of one task per item holds 10,000 tasks and their frames at
    once (the operator's peak memory); this holds ``limit``. The first error cancels the rest."""
    results: dict[int, R] = {}
    cursor = iter(range(len(items)))  # shared: each index is taken by exactly one worker

    async def worker() -> None:
        for i in cursor:
            results[i] = await fn(items[i])

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(max(1, min(limit, len(items)))):
                group.create_task(worker())
    except ExceptionGroup as failed:  # callers handle an error as a plain gather raised it
        raise failed.exceptions[0] from None
    return [results[i] for i in range(len(items))]


class WorkQueue:
    """Runs ``reconcile`` for each pool when ``controller.schedule`` says; call from the event loop's thread."""

    def __init__(
        self, reconcile: Reconcile, settings: QueueSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._reconcile, self.settings, self._clock = reconcile, settings, clock
        self._schedule = Schedule({}, resync_at=clock() + settings.resync_s)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, namespace: str, name: str) -> None:
        """Ask for a reconcile of one pool: at once, or after its running one."""
        self._put((namespace, name), schedule.trigger(self._entry(namespace, name), self._clock()))

    def add_windowed(self, namespace: str, name: str) -> None:
        """Ask for a reconcile at most once per ``settings.window_s`` (engine pod events)."""
        entry = schedule.trigger_windowed(self._entry(namespace, name), self._clock(), self.settings.window_s)
        self._put((namespace, name), entry)

    def forget(self, namespace: str, name: str) -> None:
        """The pool was deleted: stop resyncing it."""
        self._schedule = self._schedule.forget((namespace, name))

    def _entry(self, namespace: str, name: str) -> schedule.Entry | None:
        return self._schedule.entries.get((namespace, name))

    def _put(self, key: Key, entry: schedule.Entry) -> None:
        self._schedule = self._schedule.put(key, entry)
        self._wake.set()

    async def run(self) -> None:
        """Start each pool's run when it is due, until cancelled (then the runs in flight are cancelled too)."""
        try:
            while True:
                self._wake.clear()
                self._schedule, ready = schedule.start(self._schedule, self._clock(), self.settings)
                for key in ready:
                    task = asyncio.create_task(self._work(key), name=f"reconcile {key[0]}/{key[1]}")
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                wait_s = max(schedule.next_wake(self._schedule) - self._clock(), 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _work(self, key: Key) -> None:
        started = time.monotonic()
        outcome: Result | None = None
        try:
            outcome = await self._reconcile(*key)
            RECONCILES.labels("ok").inc()
        except RetryLater as exc:  # already a condition and an Event on the pool
            RECONCILES.labels("error").inc()
            log.warning("Retrying LoRAPool later: %s", exc, extra={"pool": "/".join(key)})
        except Exception:  # a reconcile must never kill the operator; the queue retries with backoff
            RECONCILES.labels("error").inc()
            log.exception("Failed to reconcile LoRAPool", extra={"pool": "/".join(key)})
        finally:
            DURATION.observe(time.monotonic() - started)
        entry = self._schedule.entries.get(key)
        if entry is not None:
            self._put(key, schedule.finish(entry, outcome, self._clock(), self.settings))
