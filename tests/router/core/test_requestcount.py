"""The router's per-adapter request counter: windows close on time, what is counted, memory bounds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lorapool.api.requests import MAX_ADAPTERS, RequestWindow, decode, encode
from lorapool.router.core.requestcount import RequestCounter

WALL0 = 1_760_000_000.0  # the wall clock when the monotonic clock reads 0


@dataclass(frozen=True)
class Req:
    at_s: float
    model: str
    is_adapter: bool = True
    known: bool = True


def run(reqs: list[Req], until_s: float, *, window_s: float = 10.0, max_adapters: int = 100) -> RequestCounter:
    counter = RequestCounter(window_s, 0.0, max_adapters=max_adapters)
    for r in reqs:
        counter.count(r.model, is_adapter=r.is_adapter, known=r.known, now_s=r.at_s, wall_s=WALL0 + r.at_s)
    counter.roll(until_s, WALL0 + until_s)
    return counter


@pytest.mark.parametrize(
    ("reqs", "until_s", "want"),
    [
        pytest.param([Req(1, "a")], 9.99, None, id="nothing-closed-before-the-first-window-ends"),
        pytest.param(
            [Req(1, "a"), Req(2, "b"), Req(9.5, "a")],
            10.0,
            RequestWindow(10.0, WALL0 + 10, {"a": 2, "b": 1}),
            id="closes-exactly-on-time-with-its-counts",
        ),
        pytest.param(
            [Req(1, "a"), Req(10.0, "b"), Req(15, "b")],
            25.0,
            RequestWindow(10.0, WALL0 + 20, {"b": 2}),
            id="a-request-on-the-boundary-opens-the-next-window",
        ),
        pytest.param(
            [Req(1, "meta-llama/base", is_adapter=False), Req(2, "a")],
            12.0,
            RequestWindow(10.0, WALL0 + 10, {"a": 1}),
            id="base-model-not-counted",
        ),
        pytest.param(
            [Req(1, "typo", known=False), Req(2, "random-1", known=False), Req(3, "a")],
            12.0,
            RequestWindow(10.0, WALL0 + 10, {"a": 1}, other=2),
            id="names-no-backend-knows-go-to-other",
        ),
        pytest.param(
            [Req(1, "a"), Req(2, "b"), Req(3, "c"), Req(4, "a"), Req(5, "d")],
            12.0,
            RequestWindow(10.0, WALL0 + 10, {"a": 2, "b": 1}, other=2),
            id="beyond-max-adapters-names-go-to-other",
        ),
        pytest.param(
            [Req(1, "a"), Req(5, "a")],
            35.0,
            RequestWindow(10.0, WALL0 + 30, {}),
            id="idle-windows-close-empty",
        ),
        pytest.param(
            [Req(1, "a"), Req(5, "a"), Req(12, "b")],
            20.5,
            RequestWindow(10.0, WALL0 + 20, {"b": 1}),
            id="the-last-closed-window-replaces-the-one-before",
        ),
    ],
)
def test_windows(reqs: list[Req], until_s: float, want: RequestWindow | None) -> None:
    assert run(reqs, until_s, max_adapters=2).last == want


def test_roll_returns_a_window_once_when_it_closes() -> None:
    counter = RequestCounter(5.0, 100.0)
    counter.count("a", is_adapter=True, known=True, now_s=101.0, wall_s=WALL0 + 1)
    assert counter.roll(104.0, WALL0 + 4) is None
    closed = counter.roll(105.5, WALL0 + 5.5)
    assert closed == RequestWindow(5.0, WALL0 + 5, {"a": 1})
    assert counter.roll(106.0, WALL0 + 6) is None
    assert counter.last == closed
    assert counter.closes_at_s == 110.0


def test_a_flood_of_random_names_keeps_memory_bounded() -> None:
    counter = RequestCounter(60.0, 0.0, max_adapters=50)
    for i in range(10_000):
        counter.count(f"rand-{i}", is_adapter=True, known=i % 2 == 0, now_s=1.0, wall_s=WALL0)
    closed = counter.roll(60.0, WALL0 + 60)
    assert closed is not None
    assert len(closed.counts) == 50
    assert closed.total == 10_000


@pytest.mark.parametrize("window_s", [0.0, -1.0, float("nan"), float("inf")])
def test_a_window_must_be_positive(window_s: float) -> None:
    with pytest.raises(ValueError, match="--requests-window-s must be > 0"):
        RequestCounter(window_s, 0.0)


def test_a_hot_adapter_first_seen_after_a_long_tail_is_still_published_by_name() -> None:
    counter = RequestCounter(60.0, 0.0)  # the default bound
    for i in range(MAX_ADAPTERS + 1_000):  # a long tail, one request each, before the hot adapter's first
        counter.count(f"tail-{i:05d}", is_adapter=True, known=True, now_s=1.0, wall_s=WALL0)
    for _ in range(50):
        counter.count("hot", is_adapter=True, known=True, now_s=2.0, wall_s=WALL0)
    closed = counter.roll(60.0, WALL0 + 60)
    assert closed is not None
    published = decode(encode(closed))
    assert published is not None
    assert published.counts["hot"] == 50 and len(published.counts) == MAX_ADAPTERS
    assert published.total == MAX_ADAPTERS + 1_000 + 50
