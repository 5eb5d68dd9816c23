"""bounded_map: the per-adapter reads and writes of a pool, a bounded number in flight, results in order."""

from __future__ import annotations

import asyncio

import pytest

from lorapool.controller.workqueue import bounded_map

pytestmark = pytest.mark.timeout(30)


def test_results_keep_the_items_order_and_at_most_limit_run_at_once() -> None:
    running, peak = 0, 0

    async def slow_square(x: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001 * (x % 3))  # finish out of order
        running -= 1
        return x * x

    assert asyncio.run(bounded_map(slow_square, list(range(50)), 4)) == [x * x for x in range(50)]
    assert peak == 4


def test_no_items_give_no_results() -> None:
    async def never(x: int) -> int:
        raise AssertionError("called")

    assert asyncio.run(bounded_map(never, [], 8)) == []


def test_the_first_error_is_raised_as_itself_and_the_rest_are_not_started() -> None:
    started: list[int] = []

    async def fails_on_three(x: int) -> int:
        started.append(x)
        await asyncio.sleep(0)
        if x == 3:
            raise ValueError("three")
        await asyncio.sleep(0.05)
        return x

    with pytest.raises(ValueError, match="three"):
        asyncio.run(bounded_map(fails_on_three, list(range(100)), 4))
    assert max(started) < 10  # the workers were cancelled, not run through the 100 items
