"""The report channel, pure parts: what a sidecar says about its engine (lorapool.api.report),
the readiness latch, and the pacing of writes (none while unchanged, at most one per interval)."""

from __future__ import annotations

import pytest

from lorapool.api.adapterset import DesiredAdapter
from lorapool.api.report import (
    ANNOTATION,
    MAX_DOCUMENT_BYTES,
    SYNCED_CONDITION,
    AdapterReport,
    ReplicaPhase,
    ReplicaReport,
    decode,
    encode,
    pod_report,
    short_id,
)
from lorapool.api.status import Condition
from lorapool.sidecar.core import AdapterState, Phase, identity_of
from lorapool.sidecar.podreport import (
    Pacer,
    Readiness,
    first_sync_done,
    next_readiness,
    pod_patch,
    replica_report,
    synced_condition,
)
from lorapool.sources.store import adapter_identity

A = DesiredAdapter(name="a", source="https://h/a.tgz")
A2 = DesiredAdapter(name="a", source="https://h/a.tgz", revision="v2")
B = DesiredAdapter(name="b", source="s3://bucket/b")


def test_the_store_and_the_operator_share_one_identity() -> None:
    assert adapter_identity("s3://bucket/x", "v1", None) == identity_of(
        DesiredAdapter(name="x", source="s3://bucket/x", revision="v1")
    )


REPORTS = {
    "loaded": (
        {"a": A},
        {"a": AdapterState("a", Phase.LOADED, loaded=identity_of(A))},
        {},
        {"a": AdapterReport(Phase.LOADED, id=short_id(identity_of(A)), loaded=short_id(identity_of(A)))},
    ),
    "loaded-from-a-tag-carries-its-digest": (
        {"a": A},
        {"a": AdapterState("a", Phase.LOADED, loaded=identity_of(A), resolved="sha256:" + "d" * 64)},
        {},
        {
            "a": AdapterReport(
                Phase.LOADED,
                id=short_id(identity_of(A)),
                loaded=short_id(identity_of(A)),
                revision="sha256:" + "d" * 64,
            )
        },
    ),
    "a-digest-is-not-reported-before-the-load": (
        {"a": A},
        {"a": AdapterState("a", Phase.LOADING, resolved="sha256:" + "d" * 64)},
        {},
        {"a": AdapterReport(Phase.LOADING, id=short_id(identity_of(A)))},
    ),
    "hot-swap-keeps-the-old-identity-loaded": (
        {"a": A2},
        {"a": AdapterState("a", Phase.DOWNLOADING, loaded=identity_of(A))},
        {},
        {"a": AdapterReport(Phase.DOWNLOADING, id=short_id(identity_of(A2)), loaded=short_id(identity_of(A)))},
    ),
    "failed-carries-the-reason-not-the-attempts": (
        {"b": B},
        {"b": AdapterState("b", Phase.FAILED, error="rank 64 > 16", attempts=7, next_retry_at=5.0)},
        {},
        {"b": AdapterReport(Phase.FAILED, id=short_id(identity_of(B)), message="rank 64 > 16")},
    ),
    "unloading-is-not-desired": (
        {},
        {"a": AdapterState("a", Phase.UNLOADING)},
        {},
        {"a": AdapterReport(Phase.UNLOADING)},
    ),
    "refused-entry": (
        {},
        {},
        {"bad": "adapter 'bad': source: invalid"},
        {"bad": AdapterReport(Phase.FAILED, message="adapter 'bad': source: invalid")},
    ),
}


@pytest.mark.parametrize(("desired", "state", "rejected", "expected"), list(REPORTS.values()), ids=list(REPORTS))
def test_replica_report(
    desired: dict[str, DesiredAdapter],
    state: dict[str, AdapterState],
    rejected: dict[str, str],
    expected: dict[str, AdapterReport],
) -> None:
    report = replica_report(desired, state, rejected, engine_healthy=True)
    assert dict(report.adapters) == expected
    assert decode(encode(report)) == report  # the annotation round-trips


def test_report_questions_the_operator_asks() -> None:
    want, old = identity_of(A2), identity_of(A)
    report = ReplicaReport(
        True,
        {
            "a": AdapterReport(Phase.FAILED, id=short_id(want), loaded=short_id(old), message="engine said no"),
            "b": AdapterReport(Phase.LOADING, id="x"),
        },
    )
    assert not report.holds("a", want) and report.holds("a", old)  # the previous revision still serves
    assert report.failure("a", want) == "engine said no" and report.failure("a", old) is None
    assert report.loading("b") and not report.loading("a") and not report.holds("c", want)


@pytest.mark.parametrize(
    "text",
    [None, "", "not json", "[]", '{"v": 2, "adapters": {}}', '{"v": 1, "adapters": {"a": {"phase": "Nope"}}}'],
    ids=["absent", "empty", "garbage", "list", "newer-version", "unknown-phase"],
)
def test_unreadable_annotations_are_no_report(text: str | None) -> None:
    assert decode(text) is None


def test_encode_is_stable_compact_and_bounded() -> None:
    report = ReplicaReport(
        True, {f"adapter-{i:04d}": AdapterReport(Phase.LOADED, id="i" * 16, loaded="i" * 16) for i in range(1000)}
    )
    text = encode(report)
    assert text == encode(ReplicaReport(True, dict(reversed(list(report.adapters.items())))))  # order-free
    print(f"1,000 loaded adapters: {len(text):,} bytes")
    assert len(text) < 80_000  # well inside the 256 KiB the API server allows for all annotations
    failing = ReplicaReport(
        True, {f"a{i}": AdapterReport(Phase.FAILED, id="i", message="x" * 5000) for i in range(1000)}
    )
    bounded = encode(failing)
    assert len(bounded) <= MAX_DOCUMENT_BYTES and decode(bounded) is not None  # messages dropped, phases kept
    pod = {"metadata": {"annotations": {"lorapool.io/adapters": text}}}
    assert pod_report(pod) == report and pod_report({"metadata": {}}) is None


def test_first_sync_counts_failures_so_one_broken_adapter_keeps_no_pod_out() -> None:
    state = {"a": AdapterState("a", Phase.LOADED), "b": AdapterState("b", Phase.FAILED)}
    assert first_sync_done({"a", "b"}, state, engine_healthy=True, config_read=True)
    assert not first_sync_done({"a", "b", "c"}, state, engine_healthy=True, config_read=True)
    assert not first_sync_done({"a"}, state, engine_healthy=False, config_read=True)
    assert not first_sync_done(set(), {}, engine_healthy=True, config_read=False)
    assert synced_condition(True, {"a", "b"}, state).reason == "SyncedWithFailures"
    busy = {**state, "c": AdapterState("c", Phase.DOWNLOADING)}
    cond = synced_condition(True, {"a", "b", "c"}, busy)  # latched: a new adapter does not pull the pod out
    assert cond.status and cond.message == "1 loaded, 1 failed, 1 in progress of 3"
    assert not synced_condition(False, {"a"}, state).status


def test_pacer_writes_nothing_while_unchanged_and_at_most_once_per_interval() -> None:
    p = Pacer(min_interval_s=2.0)
    assert p.next_write_at("d1", 0.0) == 0.0  # the first report goes at once
    p = p.sent("d1", 0.0)
    assert p.next_write_at("d1", 100.0) is None  # unchanged: never
    assert p.next_write_at("d2", 0.5) == 2.0  # changed soon after: waits out the interval
    assert p.next_write_at("d2", 7.0) == 7.0
    p = p.failed(7.0).failed(8.0).failed(9.0)
    assert p.next_write_at("d2", 9.0) == 9.0 + 4.0  # backs off: 1, 2, 4 s ... (never under the interval)
    assert p.sent("d2", 13.0).failures == 0


def test_the_same_state_gives_the_same_patch_so_an_idle_sidecar_writes_nothing() -> None:
    state = {"a": AdapterState("a", Phase.LOADED, loaded=identity_of(A), loaded_at=1.0, attempts=0)}
    later = {"a": AdapterState("a", Phase.LOADED, loaded=identity_of(A), loaded_at=1.0, attempts=0, next_retry_at=9.0)}
    one = encode(replica_report({"a": A}, state, {}, engine_healthy=True))
    two = encode(replica_report({"a": A}, later, {}, engine_healthy=True))
    assert one == two
    assert ReplicaPhase.LOADED == Phase.LOADED  # one vocabulary for the sidecar and the report


T0, T1, T2 = 0.0, 60.0, 120.0  # 1970-01-01T00:00:00Z, 00:01:00Z, 00:02:00Z
LOADING = {"a": AdapterState("a", Phase.DOWNLOADING)}
HELD = {"a": AdapterState("a", Phase.LOADED)}

READINESS = {
    # id: [(state, engine healthy, restarted before this build, now)] -> [(status, reason, lastTransitionTime)]
    "syncing-then-synced": (
        [(LOADING, True, False, T0), (HELD, True, False, T1), (HELD, True, False, T2)],
        [
            ("False", "Syncing", "1970-01-01T00:00:00Z"),
            ("True", "Synced", "1970-01-01T00:01:00Z"),
            ("True", "Synced", "1970-01-01T00:01:00Z"),  # unchanged status: the time stays
        ],
    ),
    "latched-stays-true-while-a-new-revision-loads": (
        [(HELD, True, False, T0), (LOADING, True, False, T1)],
        [("True", "Synced", "1970-01-01T00:00:00Z"), ("True", "Synced", "1970-01-01T00:00:00Z")],
    ),
    "a-restart-earns-it-again": (
        [(HELD, True, False, T0), (LOADING, True, True, T1), (HELD, True, False, T2)],
        [
            ("True", "Synced", "1970-01-01T00:00:00Z"),
            ("False", "Syncing", "1970-01-01T00:01:00Z"),
            ("True", "Synced", "1970-01-01T00:02:00Z"),
        ],
    ),
    "an-unhealthy-engine-does-not-latch": (
        [(HELD, False, False, T0), (HELD, True, False, T1)],
        [("False", "Syncing", "1970-01-01T00:00:00Z"), ("True", "Synced", "1970-01-01T00:01:00Z")],
    ),
}


@pytest.mark.parametrize(("builds", "expected"), list(READINESS.values()), ids=list(READINESS))
def test_the_synced_condition_stamps_its_transitions(
    builds: list[tuple[dict[str, AdapterState], bool, bool, float]], expected: list[tuple[str, str, str]]
) -> None:
    readiness, seen = Readiness(), []
    for state, healthy, restarted, now in builds:
        if restarted:
            readiness = readiness.restarted()
        readiness, condition = next_readiness(
            readiness, {"a"}, state, engine_healthy=healthy, config_read=True, now=now
        )
        assert condition.type == SYNCED_CONDITION and readiness.shown == condition
        seen.append((condition.status, condition.reason, condition.last_transition_time))
    assert seen == expected


def test_the_pod_patch_carries_the_report_and_the_condition_in_the_operators_model() -> None:
    report = replica_report({"a": A}, HELD, {}, engine_healthy=True)
    _, condition = next_readiness(Readiness(), {"a"}, HELD, engine_healthy=True, config_read=True, now=T1)
    assert isinstance(condition, Condition)
    assert pod_patch(report, condition) == {
        "metadata": {"annotations": {ANNOTATION: encode(report)}},
        "status": {
            "conditions": [
                {
                    "type": SYNCED_CONDITION,
                    "status": "True",
                    "reason": "Synced",
                    "message": "1 loaded, 0 failed, 0 in progress of 1",
                    "lastTransitionTime": "1970-01-01T00:01:00Z",
                }
            ]
        },
    }
