"""Status patches remove what left a nested map (a phase whose count fell to zero), so a writer that
compares the stored status with what it wants converges instead of writing the same patch again."""

from __future__ import annotations

from lorapool.api import mergepatch
from lorapool.controller.index import AdapterIndex
from lorapool.controller.status import status_changed


def test_a_phase_that_left_the_counts_is_sent_as_null_and_then_nothing_is_written() -> None:
    stored = {"adapterPhases": {"Ready": 10000, "Loading": 1}, "adapterCount": 10001, "other": "kept"}
    desired = {"adapterPhases": {"Ready": 10001}, "adapterCount": 10001}
    patch = mergepatch.patch_of(stored, desired)
    assert patch == {"adapterPhases": {"Ready": 10001, "Loading": None}, "adapterCount": 10001}
    assert status_changed(stored, patch)
    after = mergepatch.apply(stored, patch)
    assert after == {"adapterPhases": {"Ready": 10001}, "adapterCount": 10001, "other": "kept"}  # not ours: kept
    assert not status_changed(after, mergepatch.patch_of(after, desired))  # converged: no second write


def test_nested_objects_lists_and_top_level_nulls() -> None:
    stored = {"plan": {"reasons": {"maxLoras": "a", "old": "b"}, "memory": {"x": 1}}, "conditions": [{"t": 1}]}
    desired = {"plan": {"reasons": {"maxLoras": "c"}}, "conditions": [{"t": 2}], "message": None}
    patch = mergepatch.patch_of(stored, desired)
    assert patch == {
        "plan": {"reasons": {"maxLoras": "c", "old": None}, "memory": None},
        "conditions": [{"t": 2}],  # a list is replaced whole
        "message": None,
    }
    assert mergepatch.apply(stored, patch) == {"plan": {"reasons": {"maxLoras": "c"}}, "conditions": [{"t": 2}]}
    assert mergepatch.apply({}, {"a": {"b": None, "c": 1}}) == {"a": {"c": 1}}


def test_the_index_keeps_what_the_server_keeps_after_a_status_patch() -> None:
    index = AdapterIndex()
    body = {
        "metadata": {"namespace": "ml", "name": "a"},
        "spec": {"poolRef": {"name": "p"}},
        "status": {"phase": "Loading", "loadedReplicas": 0, "detail": {"x": 1, "y": 2}},
    }
    index.observe("ADDED", body)
    index.record_status("ml", "a", {"phase": "Ready", "detail": {"y": None}, "message": None})
    assert index.of_pool("ml", "p")[0]["status"] == {"phase": "Ready", "loadedReplicas": 0, "detail": {"x": 1}}
