"""The router's per-adapter request counts on its Pod: round trip, the size cut, and bad annotations."""

from __future__ import annotations

import json

import pytest

from lorapool.api.requests import ANNOTATION, RequestWindow, decode, encode, pod_requests


def test_round_trip_keeps_counts_window_and_rates() -> None:
    w = RequestWindow(window_s=60.0, end=1_760_000_000.0, counts={"b": 3, "a": 120}, other=0)
    back = decode(encode(w))
    assert back == w
    assert back.rate("a") == 2.0
    assert back.rate("missing") == 0.0
    assert back.total == 123


def test_same_window_same_text() -> None:
    a = encode(RequestWindow(60.0, 1.0, {"x": 1, "y": 2}))
    b = encode(RequestWindow(60.0, 1.0, {"y": 2, "x": 1}))
    assert a == b


def test_beyond_the_busiest_adapters_counts_are_summed_not_lost() -> None:
    counts = {f"lora-{i:04d}": i for i in range(1, 11)}  # 1..10 requests
    back = decode(encode(RequestWindow(10.0, 5.0, counts, other=4), max_adapters=3))
    assert back is not None
    assert set(back.counts) == {"lora-0010", "lora-0009", "lora-0008"}
    assert back.other == 4 + sum(range(1, 8))
    assert back.total == sum(counts.values()) + 4


def test_a_catalog_of_thousands_fits_the_annotation_budget() -> None:
    counts = {f"tenant-{i:05d}-support-assistant-v{i % 7}": 1 + i % 50 for i in range(10_000)}
    text = encode(RequestWindow(60.0, 1.0, counts))
    assert len(text.encode()) < 200 * 1024
    back = decode(text)
    assert back is not None and back.total == sum(counts.values())


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        json.dumps({"v": 2, "w": 60, "t": 1, "c": {}}),  # a newer writer
        json.dumps({"v": 1, "t": 1, "c": {}}),  # no window
        json.dumps({"v": 1, "w": 0, "t": 1, "c": {}}),  # an empty window has no rate
        json.dumps({"v": 1, "w": 60, "t": 1, "c": {"a": -1}}),
        json.dumps({"v": 1, "w": 60, "t": 1, "c": {"a": "many"}}),
        json.dumps({"v": 1, "w": 60, "t": 1, "c": ["a"]}),
    ],
)
def test_unreadable_annotations_read_as_none(text: str | None) -> None:
    assert decode(text) is None


def test_read_from_a_pod_object() -> None:
    w = RequestWindow(60.0, 2.0, {"a": 6})
    assert pod_requests({"metadata": {"annotations": {ANNOTATION: encode(w)}}}) == w
    assert pod_requests({"metadata": {}}) is None
