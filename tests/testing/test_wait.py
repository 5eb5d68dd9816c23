"""wait_until: returns the first truthy value, retries listed errors, and explains a timeout."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from lorapool_dev.testing.wait import WaitTimeout, wait_until, wait_until_async


def test_returns_the_first_truthy_value() -> None:
    values = iter([0, None, "", 7, 8])
    assert wait_until("a value", lambda: next(values), timeout_s=5, interval_s=0) == 7


def test_listed_errors_mean_not_yet() -> None:
    calls = itertools.count()

    def check() -> str:
        if next(calls) < 2:
            raise ConnectionRefusedError("still starting")
        return "up"

    assert wait_until("the server", check, timeout_s=5, interval_s=0) == "up"


def test_an_unlisted_error_propagates_at_once() -> None:
    def check() -> bool:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        wait_until("a buggy check", check, timeout_s=5)


def test_a_timeout_names_what_was_awaited_and_the_last_value_seen() -> None:
    values = itertools.count()
    with pytest.raises(WaitTimeout, match=r"waiting for running == 0; last seen: 0 ?.*state: page text"):
        wait_until(
            "running == 0", lambda: next(values) * 0, timeout_s=0.05, interval_s=0.01, describe=lambda: "page text"
        )


def test_a_timeout_reports_the_last_error() -> None:
    def check() -> bool:
        raise ConnectionResetError("reset by peer")

    with pytest.raises(WaitTimeout, match="last seen: ConnectionResetError: reset by peer"):
        wait_until("a connection", check, timeout_s=0.05, interval_s=0.01)


def test_the_async_wait_yields_to_the_loop_and_awaits_an_awaitable_check() -> None:
    async def main() -> tuple[int, str]:
        ticks: list[int] = []

        async def ticker() -> None:  # runs only while the wait sleeps: the pauses yield
            while True:
                ticks.append(len(ticks))
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        seen = await wait_until_async("three ticks", lambda: len(ticks) >= 3 and len(ticks), timeout_s=5)

        async def ready() -> str:
            return "ready"

        got = await wait_until_async("an awaitable check", ready, timeout_s=5)
        task.cancel()
        return seen, got

    seen, got = asyncio.run(main())
    assert seen >= 3 and got == "ready"


def test_the_async_wait_times_out_like_the_sync_one() -> None:
    with pytest.raises(WaitTimeout, match=r"timed out after 0.1 s waiting for never; last seen: 0"):
        asyncio.run(wait_until_async("never", lambda: 0, timeout_s=0.1))
