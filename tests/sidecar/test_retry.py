"""What a failed or repeated adapter action leaves behind (sidecar/retry.py): pure tables."""

from __future__ import annotations

import random

import pytest

from lorapool.api.adapterset import DesiredAdapter
from lorapool.sidecar.core import UNLOAD, AdapterState, Phase, identity_of
from lorapool.sidecar.retry import Backoff, Failure, about, after_failure, after_unload, internal_failure

A = DesiredAdapter(name="a", source="https://h/a.tgz")
A2 = DesiredAdapter(name="a", source="https://h/a.tgz", revision="v2")
NOW = 1000.0
BACKOFF = Backoff(base_s=1.0, cap_s=300.0)
BROKEN = Failure("download", "adapter 'a': 503 from S3", transient=True)
REFUSED = Failure("rank", "adapter 'a': rank 64 exceeds 16", transient=False)

FAILURES = {
    # id: (state before, identity that failed, failure) -> (attempts, delay range, error)
    "first-transient": (AdapterState("a"), identity_of(A), BROKEN, 1, (0.0, 1.0), BROKEN.message),
    "same-identity-counts-up": (
        AdapterState("a", Phase.FAILED, attempts=4, failed=identity_of(A)),
        identity_of(A),
        BROKEN,
        5,
        (0.0, 16.0),
        BROKEN.message,
    ),
    "new-identity-starts-over": (
        AdapterState("a", Phase.FAILED, attempts=4, failed=identity_of(A)),
        identity_of(A2),
        BROKEN,
        1,
        (0.0, 1.0),
        BROKEN.message,
    ),
    "permanent-waits-near-the-cap": (AdapterState("a"), identity_of(A), REFUSED, 1, (150.0, 300.0), REFUSED.message),
    "failed-revision-says-the-old-one-serves": (
        AdapterState("a", Phase.LOADED, loaded=identity_of(A)),
        identity_of(A2),
        BROKEN,
        1,
        (0.0, 1.0),
        BROKEN.message + "; the previously loaded revision keeps serving",
    ),
    "failed-reload-of-the-same-identity-says-nothing-more": (
        AdapterState("a", Phase.LOADED, loaded=identity_of(A)),
        identity_of(A),
        BROKEN,
        1,
        (0.0, 1.0),
        BROKEN.message,
    ),
    "failed-unload-says-nothing-more": (
        AdapterState("a", Phase.UNLOADING, loaded=identity_of(A)),
        UNLOAD,
        Failure("unload", "adapter 'a': 500", transient=True),
        1,
        (0.0, 1.0),
        "adapter 'a': 500",
    ),
}


@pytest.mark.parametrize(
    ("before", "failed", "failure", "attempts", "delay", "error"), list(FAILURES.values()), ids=list(FAILURES)
)
def test_after_failure(
    before: AdapterState,
    failed: str,
    failure: Failure,
    attempts: int,
    delay: tuple[float, float],
    error: str,
) -> None:
    retry = after_failure(before, failed, failure, NOW, random.Random(5), BACKOFF)
    st = retry.state
    assert (st.phase, st.attempts, st.failed, st.error) == (Phase.FAILED, attempts, failed, error)
    assert delay[0] <= retry.delay_s <= delay[1]
    assert st.next_retry_at == NOW + retry.delay_s
    assert st.loaded == before.loaded  # what the engine holds is not changed by a failure


UNLOADS = {
    # id: state before -> (repeats, delay ceiling, error names the repeats)
    "first-unload-is-quiet": (AdapterState("a", Phase.UNLOADING, loaded=identity_of(A)), 1, 1.0, None),
    "a-failed-load-then-unload-starts-at-one": (
        AdapterState("a", Phase.FAILED, attempts=3, failed=identity_of(A)),
        1,
        1.0,
        None,
    ),
    "listed-again-backs-off-and-says-why": (
        AdapterState("a", Phase.UNLOADING, attempts=2, failed=UNLOAD),
        3,
        4.0,
        "adapter 'a': the engine lists it again after 2 unloads; "
        "remove it from the engine's --lora-modules or whatever else loads it",
    ),
}


@pytest.mark.parametrize(("before", "repeats", "ceiling", "error"), list(UNLOADS.values()), ids=list(UNLOADS))
def test_after_unload(before: AdapterState, repeats: int, ceiling: float, error: str | None) -> None:
    retry = after_unload(before, NOW, random.Random(5), BACKOFF)
    st = retry.state
    assert (st.phase, st.loaded, st.failed, st.attempts, st.error) == (Phase.UNLOADING, None, UNLOAD, repeats, error)
    assert 0.0 <= retry.delay_s <= ceiling and st.next_retry_at == NOW + retry.delay_s


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("503 from S3", "adapter 'a': 503 from S3"),
        ("adapter 'a': rank 64 exceeds 16", "adapter 'a': rank 64 exceeds 16"),
        ("adapter 'ab': x", "adapter 'a': adapter 'ab': x"),
    ],
    ids=["prefixed", "already-named", "another-name"],
)
def test_about_names_the_adapter_once(message: str, expected: str) -> None:
    assert about("a", message) == expected


def test_an_internal_failure_is_retried_and_reported_as_a_bug() -> None:
    assert internal_failure("a", "KeyError", "'x'") == Failure(
        "internal", "adapter 'a': internal error KeyError: 'x'; report a bug", transient=True
    )
