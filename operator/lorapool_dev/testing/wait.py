"""Wait on a condition with a deadline: the one polling loop of tests, benchmark and playground.

Processes, controllers and engines act asynchronously, so a check of "has it happened yet" is
only meaningful when it is repeated until it holds or a deadline passes. A single sample of a
moving value (a metric, a pod phase) or a fixed sleep makes a test pass or fail at random.

    running = wait_until("the simulator to run 1 request", lambda: running(sim) == 1, timeout_s=10)
    pool = wait_until("pool Ready", lambda: ready_pool(api), timeout_s=120, interval_s=0.5)

``check`` returns a value; a truthy value ends the wait and is returned. An exception listed in
``retry_on`` counts as "not yet" (a server still starting refuses connections) and is kept as
the last thing seen. On timeout ``WaitTimeout`` names what was awaited and what was last seen,
so a failure reads as a diagnosis, not as "False is not true".
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

_LAST_SEEN_CHARS = 2000


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline (an AssertionError, so pytest shows it as a failure)."""


def wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = 30.0,
    *,
    interval_s: float = 0.05,
    max_interval_s: float = 0.5,
    retry_on: tuple[type[BaseException], ...] = (OSError,),
    describe: Callable[[], object] | None = None,
) -> T:
    """Call ``check`` until it returns something truthy and return that; raise WaitTimeout after ``timeout_s``.

    The pause between checks starts at ``interval_s`` and grows by half each time up to
    ``max_interval_s``: quick conditions are seen at once, and a minute-long wait on a control
    plane does not spend the CPU it is waiting for. ``describe``, when given, is called once on
    timeout to add the state worth seeing (for example the whole metrics page) to the message.
    """
    deadline = time.monotonic() + timeout_s
    last: object = "(never checked)"
    while True:
        try:
            result = check()
        except retry_on as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if result:
                return result
            last = result
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, last, describe)
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))
        interval_s = min(interval_s * 1.5, max(interval_s, max_interval_s))


async def wait_until_async(
    what: str,
    check: Callable[[], T | Awaitable[T | None] | None],
    timeout_s: float = 30.0,
    *,
    interval_s: float = 0.05,
    max_interval_s: float = 0.5,
    retry_on: tuple[type[BaseException], ...] = (OSError,),
    describe: Callable[[], object] | None = None,
) -> T:
    """``wait_until`` inside an event loop: the pauses yield to the loop's other tasks (a test that
    drives reporters or a work queue in the same loop). ``check`` may return an awaitable, e.g.
    ``lambda: asyncio.to_thread(blocking_check)`` for one that calls kubectl."""
    deadline = time.monotonic() + timeout_s
    last: object = "(never checked)"
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except retry_on as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if result:
                return result
            last = result
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, last, describe)
        await asyncio.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))
        interval_s = min(interval_s * 1.5, max(interval_s, max_interval_s))


def _timed_out(what: str, timeout_s: float, last: object, describe: Callable[[], object] | None) -> WaitTimeout:
    detail = f"; state: {_clip(describe())}" if describe is not None else ""
    return WaitTimeout(f"timed out after {timeout_s:g} s waiting for {what}; last seen: {_clip(last)}{detail}")


def _clip(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= _LAST_SEEN_CHARS else text[:_LAST_SEEN_CHARS] + " ..."
