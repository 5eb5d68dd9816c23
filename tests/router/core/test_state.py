"""Tests of per-backend accounting, wait queues and slice discovery (the metrics reader: tests/api)."""

from __future__ import annotations

from typing import Any

import pytest

from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.core.discovery import backend_urls
from lorapool.router.core.state import BackendState
from lorapool.router.core.waitqueue import WaitQueues


def up(url: str = "b", **kw: Any) -> BackendState:
    state = BackendState(url, **kw)
    state.mark_up()
    return state


def test_own_requests_count_at_once() -> None:
    s = up(max_loras=2)
    s.begin("a", is_adapter=True)
    s.begin("a", is_adapter=True)
    s.begin("base", is_adapter=False)
    view = s.view()
    assert (view.load, dict(view.active)) == (3, {"a": 2})
    s.end("a", is_adapter=True)
    s.end("a", is_adapter=True)
    assert dict(s.view().active) == {}
    assert s.view().load == 1


def test_foreign_adapters_come_from_the_engine_but_not_our_finished_ones() -> None:
    s = up(max_loras=4)
    s.begin("mine", is_adapter=True)
    s.scrape_started()
    s.end("mine", is_adapter=True)  # finished while the scrape was in flight
    s.apply_metrics(VllmMetrics(running=2, waiting=1, running_adapters=frozenset({"mine", "theirs"})))
    view = s.view()
    assert dict(view.active) == {"theirs": 1}
    assert view.load == 2  # 3 in the engine, 1 of them ours
    assert view.max_loras == 4


def test_engine_reported_slots_override_the_default() -> None:
    s = up(max_loras=1)
    s.apply_metrics(VllmMetrics(max_loras=8))
    assert s.view().max_loras == 8


def test_warm_and_cached_follow_recency() -> None:
    s = up(max_loras=2, max_cpu_loras=3)
    for model in ["a", "b", "c", "d"]:
        s.begin(model, is_adapter=True)
        s.end(model, is_adapter=True)
    view = s.view()
    assert view.warm == {"c", "d"}
    assert view.cached == {"b", "c", "d"}
    s.begin("a", is_adapter=True)
    assert s.view().warm == {"a", "d"}


def test_models_split_base_from_adapters_and_forget() -> None:
    s = up()
    s.apply_models([{"id": "base", "parent": None}, {"id": "sql", "parent": "base", "root": "/a/sql"}, {}])
    assert s.models == {"base", "sql"} and s.base_models == {"base"}
    s.forget_model("sql")
    assert s.view().models == {"base"}


def test_mark_down_forgets_foreign_load() -> None:
    s = up()
    s.apply_metrics(VllmMetrics(running=5, running_adapters=frozenset({"x"})))
    s.mark_down("connect refused")
    view = s.view()
    assert (view.up, view.load, dict(view.active)) == (False, 0, {})


def test_wait_queues_are_fifo_across_adapters() -> None:
    q: WaitQueues[str] = WaitQueues(limit=4)
    assert q.push("b", "b1", 1.0) and q.push("a", "a1", 2.0) and q.push("b", "b2", 3.0)
    assert q.models_by_age() == ["b", "a"]
    assert q.models_by_age(lambda m: m == "a") == ["a"]
    assert q.pop("b") == "b1"
    assert q.models_by_age() == ["a", "b"]
    assert (len(q), q.depths()) == (2, {"a": 1, "b": 1})


def test_wait_queues_limit_and_remove() -> None:
    q: WaitQueues[object] = WaitQueues(limit=2)
    first, second = object(), object()
    assert q.push("a", first, 0.0) and q.push("a", second, 0.0)
    assert not q.push("b", object(), 0.0)
    assert q.remove("a", first) and not q.remove("a", first) and not q.remove("z", first)
    assert q.head("a") is second and q.depth("a") == 1
    q.pop("a")
    assert len(q) == 0 and q.depths() == {} and q.head("a") is None


def slice_(endpoints: list[dict[str, Any]], ports: list[dict[str, Any]], kind: str = "IPv4") -> dict[str, Any]:
    return {"addressType": kind, "endpoints": endpoints, "ports": ports}


def ep(address: str, ready: bool | None = True) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready}
    return {"addresses": [address], "conditions": conditions}


@pytest.mark.parametrize(
    ("slices", "port_name", "urls"),
    [
        (
            [slice_([ep("10.0.0.2"), ep("10.0.0.1")], [{"name": "http", "port": 8000}])],
            None,
            ["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
        ),
        ([slice_([ep("10.0.0.1", False)], [{"port": 8000}])], None, []),
        ([slice_([ep("10.0.0.1", None)], [{"port": 8000}])], None, ["http://10.0.0.1:8000"]),
        (
            [slice_([ep("10.0.0.1")], [{"name": "metrics", "port": 9}, {"name": "http", "port": 8}])],
            None,
            ["http://10.0.0.1:8"],
        ),
        ([slice_([ep("10.0.0.1")], [{"name": "metrics", "port": 9}])], "http", []),
        ([slice_([ep("fd00::1")], [{"port": 8000}], "IPv6")], None, ["http://[fd00::1]:8000"]),
        (
            [slice_([ep("10.0.0.1")], [{"port": 8000}]), slice_([ep("10.0.0.1")], [{"port": 8000}])],
            None,
            ["http://10.0.0.1:8000"],
        ),
        ([slice_([ep("10.0.0.1")], [])], None, []),
    ],
    ids=[
        "ready endpoints sorted",
        "not ready dropped",
        "unknown readiness counts as ready",
        "http port preferred",
        "named port missing",
        "ipv6 bracketed",
        "duplicates across slices merged",
        "slice without ports skipped",
    ],
)
def test_backend_urls(slices: list[dict[str, Any]], port_name: str | None, urls: list[str]) -> None:
    assert backend_urls(slices, port_name=port_name) == urls
