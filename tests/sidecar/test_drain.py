"""Draining adapters placement moved to other replicas (sidecar/drain.py): pure tables."""

from __future__ import annotations

import pytest

from lorapool.api.adapterset import AdapterSet, DesiredAdapter
from lorapool.sidecar.drain import drain_after_config, moved_away, still_draining


def pool(*names: str) -> AdapterSet:
    return AdapterSet(
        pool="p",
        base_model="m",
        max_lora_rank=16,
        adapters=tuple(DesiredAdapter(name=n, source=f"file:///{n}") for n in names),
    )


NOW, DRAIN_S = 100.0, 30.0

CONFIGS = {
    # id: (draining before, last share, new share, the pool's listed adapters) -> draining after
    "first-config-drains-nothing": ({}, None, pool("a"), pool("a", "b"), {}),
    "moved-away-starts-draining": ({}, pool("a", "b"), pool("a"), pool("a", "b"), {"b": NOW + DRAIN_S}),
    "removed-from-the-pool-goes-at-once": ({}, pool("a", "b"), pool("a"), pool("a"), {}),
    "back-in-the-share-stops-draining": ({"b": 110.0}, pool("a"), pool("a", "b"), pool("a", "b"), {}),
    "a-second-move-keeps-the-first-time": ({"b": 110.0}, pool("a"), pool("a"), pool("a", "b"), {"b": 110.0}),
    "others-keep-draining": (
        {"c": 120.0},
        pool("a", "b"),
        pool("a"),
        pool("a", "b", "c"),
        {"b": NOW + DRAIN_S, "c": 120.0},
    ),
}


@pytest.mark.parametrize(("before", "last", "share", "listed", "after"), list(CONFIGS.values()), ids=list(CONFIGS))
def test_drain_after_config(
    before: dict[str, float], last: AdapterSet | None, share: AdapterSet, listed: AdapterSet, after: dict[str, float]
) -> None:
    assert drain_after_config(before, last, share, listed, now=NOW, drain_s=DRAIN_S) == after


def test_moved_away_is_only_what_stays_in_the_pool() -> None:
    assert moved_away(pool("a", "b", "c"), pool("a"), pool("a", "b")) == {"b"}
    assert moved_away(None, pool(), pool("a")) == set()


@pytest.mark.parametrize(
    ("now", "left"), [(100.0, {"b", "c"}), (110.0, {"c"}), (130.0, set())], ids=["both", "one-due", "all-due"]
)
def test_still_draining_drops_those_whose_time_is_up(now: float, left: set[str]) -> None:
    assert set(still_draining({"b": 110.0, "c": 120.0}, now)) == left
