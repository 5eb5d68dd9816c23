"""The sidecar's pure core: diff tables, backoff, pool checks, config parsing, status."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from lorapool.api.adapterset import AdapterSet, DesiredAdapter
from lorapool.api.peft import parse_adapter_config
from lorapool.sidecar.config import parse_config
from lorapool.sidecar.core import (
    UNLOAD,
    AdapterState,
    ConfigView,
    EngineView,
    Load,
    Phase,
    Reason,
    Unload,
    Wait,
    check_adapter,
    diff,
    identity_of,
    loaded_state,
    next_wake_s,
    status_document,
)
from lorapool.sidecar.health import lost_adapters
from lorapool.sidecar.retry import backoff_s, retry_delay_s

A = DesiredAdapter(name="a", source="https://h/a.tgz")
A2 = DesiredAdapter(name="a", source="https://h/a.tgz", revision="v2")
B = DesiredAdapter(name="b", source="s3://bucket/b")
NOW = 1000.0


def loaded(adapter: DesiredAdapter, path: str = "/ad/.store/x", **kw: Any) -> AdapterState:
    return AdapterState(adapter.name, Phase.LOADED, loaded=identity_of(adapter), loaded_path=path, **kw)


CASES: list[
    tuple[str, dict[str, DesiredAdapter], dict[str, str], dict[str, AdapterState], dict[str, Any], list[Any]]
] = [
    ("nothing-to-do", {}, {}, {}, {}, []),
    ("new-adapter-loads", {"a": A}, {}, {}, {}, [Load("a", A, inplace=False, reason=Reason.NEW)]),
    ("converged", {"a": A}, {"a": "/ad/.store/x"}, {"a": loaded(A)}, {}, []),
    (
        "new-revision-hot-swaps",
        {"a": A2},
        {"a": "/ad/.store/x"},
        {"a": loaded(A)},
        {},
        [Load("a", A2, inplace=True, reason=Reason.REVISION)],
    ),
    (
        "sha-change-hot-swaps",
        {"a": A.model_copy(update={"sha256": "f" * 64})},
        {"a": "/ad/.store/x"},
        {"a": loaded(A)},
        {},
        [Load("a", A.model_copy(update={"sha256": "f" * 64}), inplace=True, reason=Reason.REVISION)],
    ),
    ("engine-lost-it", {"a": A}, {}, {"a": loaded(A)}, {}, [Load("a", A, inplace=False, reason=Reason.LOST)]),
    (
        "unknown-content-in-engine-is-reloaded",
        {"a": A},
        {"a": "/elsewhere"},
        {},
        {},
        [Load("a", A, inplace=True, reason=Reason.ADOPT)],
    ),
    (
        "engine-path-drifted",
        {"a": A},
        {"a": "/elsewhere"},
        {"a": loaded(A)},
        {},
        [Load("a", A, inplace=True, reason=Reason.REVISION)],
    ),
    ("removed-adapter-unloads", {}, {"a": "/ad/.store/x"}, {"a": loaded(A)}, {}, [Unload("a", in_engine=True)]),
    ("foreign-adapter-unloads", {}, {"z": "/z"}, {}, {}, [Unload("z", in_engine=True)]),
    ("stale-store-entry-is-dropped", {}, {}, {}, {"stored": ["old"]}, [Unload("old", in_engine=False)]),
    (
        "failed-and-gone-is-forgotten",
        {},
        {},
        {"a": AdapterState("a", Phase.FAILED, attempts=3)},
        {},
        [Unload("a", in_engine=False)],
    ),
    ("busy-is-left-alone", {"a": A2}, {"a": "/ad/.store/x"}, {"a": AdapterState("a", busy=True)}, {}, []),
    ("busy-removed-waits-for-its-task", {}, {"a": "/x"}, {"a": AdapterState("a", busy=True)}, {}, []),
    (
        "backoff-waits",
        {"a": A},
        {},
        {"a": AdapterState("a", Phase.FAILED, failed=identity_of(A), next_retry_at=NOW + 5)},
        {},
        [Wait("a", NOW + 5)],
    ),
    (
        "backoff-over-retries",
        {"a": A},
        {},
        {"a": AdapterState("a", Phase.FAILED, failed=identity_of(A), next_retry_at=NOW)},
        {},
        [Load("a", A, inplace=False, reason=Reason.NEW)],
    ),
    (
        "spec-change-skips-backoff",
        {"a": A2},
        {},
        {"a": AdapterState("a", Phase.FAILED, failed=identity_of(A), next_retry_at=NOW + 99)},
        {},
        [Load("a", A2, inplace=False, reason=Reason.NEW)],
    ),
    (
        "failed-swap-keeps-old-and-waits",
        {"a": A2},
        {"a": "/ad/.store/x"},
        {"a": loaded(A, failed=identity_of(A2), next_retry_at=NOW + 5)},
        {},
        [Wait("a", NOW + 5)],
    ),
    ("held-invalid-entry-is-not-unloaded", {}, {"a": "/ad/.store/x"}, {"a": loaded(A)}, {"hold": ["a"]}, []),
    (
        "unload-that-came-back-backs-off",
        {},
        {"a": "/x"},
        {"a": AdapterState("a", failed=UNLOAD, next_retry_at=NOW + 3)},
        {},
        [Wait("a", NOW + 3)],
    ),
    (
        "unloaded-and-gone-is-forgotten-at-once",
        {},
        {},
        {"a": AdapterState("a", failed=UNLOAD, next_retry_at=NOW + 3)},
        {},
        [Unload("a", in_engine=False)],
    ),
    (
        "unloads-first-then-loads-then-waits",
        {"b": B, "c": A.model_copy(update={"name": "c"})},
        {"z": "/z"},
        {"c": AdapterState("c", failed=identity_of(A.model_copy(update={"name": "c"})), next_retry_at=NOW + 1)},
        {},
        [Unload("z", in_engine=True), Load("b", B, inplace=False, reason=Reason.NEW), Wait("c", NOW + 1)],
    ),
]


@pytest.mark.parametrize(
    ("desired", "actual", "state", "extra", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_diff(
    desired: dict[str, DesiredAdapter],
    actual: dict[str, str],
    state: dict[str, AdapterState],
    extra: dict[str, Any],
    expected: list[Any],
) -> None:
    assert diff(desired, actual, state, NOW, **extra) == expected


def test_lost_adapters_are_the_loaded_ones_the_engine_no_longer_lists() -> None:
    state = {"a": loaded(A), "b": AdapterState("b", Phase.FAILED), "c": loaded(B, busy=True)}
    assert lost_adapters({}, state) == ["a"]
    assert lost_adapters({"a": "/x"}, state) == []


WAKES = {
    # id: (state, draining) -> seconds until the next reconcile, resync 30 s, now NOW
    "idle-resyncs": ({}, {}, 30.0),
    "a-retry-due-first": ({"a": AdapterState("a", Phase.FAILED, next_retry_at=NOW + 5)}, {}, 5.0),
    "a-busy-adapter-is-not-waited-for": ({"a": AdapterState("a", busy=True, next_retry_at=NOW + 5)}, {}, 30.0),
    "a-drain-due-first": ({"a": AdapterState("a", next_retry_at=NOW + 9)}, {"b": NOW + 2}, 2.0),
    "overdue-waits-50ms": ({"a": AdapterState("a", next_retry_at=NOW - 9)}, {}, 0.05),
}


@pytest.mark.parametrize(("state", "draining", "wake"), list(WAKES.values()), ids=list(WAKES))
def test_next_wake(state: dict[str, AdapterState], draining: dict[str, float], wake: float) -> None:
    assert next_wake_s(state, draining, NOW, resync_s=30.0) == wake


def test_a_loaded_adapter_remembers_what_and_where_and_stays_busy_until_its_task_ends() -> None:
    st = loaded_state(Load("a", A2, inplace=True, reason=Reason.REVISION), "id", "/p", 8, source="https://h", now=NOW)
    assert st == AdapterState(
        "a", Phase.LOADED, "https://h", "v2", loaded="id", loaded_path="/p", busy=True, rank=8, loaded_at=NOW
    )


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    rng = random.Random(7)
    for attempts, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (9, 256.0), (10, 300.0), (80, 300.0)]:
        samples = [backoff_s(attempts, rng, base_s=1.0, cap_s=300.0) for _ in range(200)]
        assert all(0.0 <= s <= ceiling for s in samples)
        assert max(samples) > 0.8 * ceiling  # full jitter spans the whole range
    assert backoff_s(3, random.Random(1)) == backoff_s(3, random.Random(1))  # seeded: reproducible


RETRY = {
    # (attempts, transient) -> the range the delay falls in, base 1 s, cap 300 s
    "transient-first": (1, True, 0.0, 1.0),
    "transient-grows": (5, True, 0.0, 16.0),
    "transient-capped": (40, True, 0.0, 300.0),
    "permanent-first-waits-near-the-cap": (1, False, 150.0, 300.0),
    "permanent-later": (7, False, 150.0, 300.0),
}


@pytest.mark.parametrize(("attempts", "transient", "low", "high"), list(RETRY.values()), ids=list(RETRY))
def test_retry_delay_by_failure_kind(attempts: int, transient: bool, low: float, high: float) -> None:
    rng = random.Random(3)
    samples = [retry_delay_s(attempts, rng, transient=transient, base_s=1.0, cap_s=300.0) for _ in range(200)]
    assert all(low <= s <= high for s in samples)
    assert max(samples) - min(samples) > 0.3 * (high - low)  # jittered, never in lockstep


def test_a_permanent_failure_waits_until_the_desired_entry_changes() -> None:
    """The permanent delay parks the adapter; diff retries at once when the entry changes."""
    delay = retry_delay_s(1, random.Random(0), transient=False, base_s=1.0, cap_s=300.0)
    state = {"a": AdapterState("a", Phase.FAILED, attempts=1, failed=identity_of(A), next_retry_at=NOW + delay)}
    assert diff({"a": A}, {}, state, NOW + 60) == [Wait("a", NOW + delay)]
    assert diff({"a": A2}, {}, state, NOW + 60) == [Load("a", A2, inplace=False, reason=Reason.NEW)]


def test_the_sidecar_reads_the_transient_flag_and_engine_status() -> None:
    from lorapool.errors import AdapterError, SourceError
    from lorapool.sidecar.engine import EngineError
    from lorapool.sidecar.executor import _Refused, _transient
    from lorapool.sources import ChecksumMismatch

    cases = {
        SourceError("503 from S3"): True,
        SourceError("no such bucket", transient=False): False,
        EngineError("connection refused"): True,
        EngineError("Internal Server Error", status=500): True,
        EngineError("LoRA path does not exist", status=404): False,
        EngineError("Too Many Requests", status=429): True,
        EngineError("worker refused: LoRA rank 64 is greater than max_lora_rank 16", status=500, permanent=True): False,
        _Refused("rank", "rank 64 > 16"): False,
        AdapterError("use_dora"): False,
        ChecksumMismatch("sha256 differs"): False,
        RuntimeError("bug"): True,
    }
    assert {repr(e): _transient(e) for e in cases} == {repr(e): t for e, t in cases.items()}


POOL = AdapterSet(pool="p", base_model="meta-llama/Meta-Llama-3-8B-Instruct", max_lora_rank=16)


def _config(**kw: Any) -> Any:
    return parse_adapter_config({"r": 8, "base_model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct", **kw})


@pytest.mark.parametrize(
    ("config", "reasons", "fix"),
    [
        ({}, [], None),
        ({"r": 64}, ["rank"], "rank 64 exceeds the pool's max-lora-rank 16; set spec.lora.maxLoraRank: 64 or auto"),
        ({"r": 8, "rank_pattern": {"q_proj": 40}}, ["rank"], "set spec.lora.maxLoraRank: 64 or auto"),
        ({"use_dora": True}, ["unservable"], "retrain without DoRA"),
        ({"bias": "all"}, ["unservable"], "retrain with bias='none'"),
        (
            {"base_model_name_or_path": "mistralai/Mistral-7B-v0.1"},
            ["base-model"],
            "retrain it on meta-llama/Meta-Llama-3-8B-Instruct or attach it to a pool of that base model",
        ),
        ({"base_model_name_or_path": "/models/meta-llama/Meta-Llama-3-8B-Instruct"}, [], None),
        ({"r": 600}, ["unservable"], "retrain at <= 512"),
    ],
    ids=["ok", "rank", "rank-pattern", "dora", "bias", "base-model", "base-model-path-ok", "rank-over-512"],
)
def test_check_adapter(config: dict[str, Any], reasons: list[str], fix: str | None) -> None:
    problems = check_adapter("x", _config(**config), POOL)
    assert [p.reason for p in problems] == reasons
    if fix:
        assert problems[0].message.startswith("adapter 'x': ") and fix in problems[0].message


def _doc(adapters: list[Any], **top: Any) -> bytes:
    body = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "AdapterSet",
        "pool": "p",
        "baseModel": "b/m",
        "maxLoraRank": 16,
        "adapters": adapters,
        **top,
    }
    return json.dumps(body).encode()


def test_parse_config_rejects_bad_entries_but_keeps_the_rest() -> None:
    parsed = parse_config(
        _doc(
            [
                {"name": "good", "source": "https://h/a.tgz"},
                {"name": "../evil", "source": "https://h/a.tgz"},
                {"name": "bad-sha", "source": "https://h/a.tgz", "sha256": "nope"},
                {"name": "good", "source": "https://h/b.tgz"},
                {"source": "https://h/c.tgz"},
            ]
        ),
        path="/etc/lorapool/adapters.json",
    )
    assert [a.name for a in parsed.adapters.adapters] == ["good"]
    assert set(parsed.rejected) == {"../evil", "bad-sha", "adapters[4]"} | {"good"}
    assert "name: String should match pattern" in parsed.rejected["../evil"]
    assert "listed twice" in parsed.rejected["good"]
    assert all("fix this entry" in v or "keep one entry" in v for v in parsed.rejected.values())


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (b"{not json", "not valid JSON"),
        (_doc([], maxLoraRank=0), "maxLoraRank"),
        (b'{"adapters": "x"}', "fix the ConfigMap"),
        (b"[]", "fix the ConfigMap"),
    ],
    ids=["json", "top-level-field", "adapters-not-a-list", "not-an-object"],
)
def test_parse_config_refuses_a_bad_document(text: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_config(text, path="/etc/lorapool/adapters.json")


def test_status_document_shape() -> None:
    state = {
        "a": loaded(A, rank=8, loaded_at=0.0, source="https://h/a.tgz"),
        "b": AdapterState("b", Phase.FAILED, attempts=2, next_retry_at=60.0, error="adapter 'b': boom; fix it"),
    }
    doc = status_document(EngineView("http://e", True, 1), ConfigView("/c", None, 0.0), POOL, state, {"bad": "why"})
    assert doc["engine"] == {"url": "http://e", "healthy": True, "restarts": 1}
    assert doc["config"] == {"path": "/c", "error": None, "loadedAt": "1970-01-01T00:00:00Z"}
    assert doc["maxLoraRank"] == 16
    by_name = {a["name"]: a for a in doc["adapters"]}
    assert by_name["a"]["phase"] == "Loaded" and by_name["a"]["loadedAt"] == "1970-01-01T00:00:00Z"
    assert by_name["b"]["nextRetryAt"] == "1970-01-01T00:01:00Z" and by_name["b"]["attempts"] == 2
    assert by_name["bad"] == {
        "name": "bad",
        "source": None,
        "revision": None,
        "phase": "Failed",
        "rank": None,
        "error": "why",
        "loadedAt": None,
        "attempts": 0,
        "nextRetryAt": None,
    }
    assert set(by_name["a"]) == {
        "name",
        "source",
        "revision",
        "phase",
        "rank",
        "error",
        "loadedAt",
        "attempts",
        "nextRetryAt",
        "resolvedRevision",
    }
