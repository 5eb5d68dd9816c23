"""Engine health and restart detection (sidecar/health.py): pure tables."""

from __future__ import annotations

import pytest

from lorapool.api.adapterset import DesiredAdapter
from lorapool.sidecar.core import AdapterState, Phase, identity_of
from lorapool.sidecar.health import (
    EngineHealth,
    HealthEvent,
    Restart,
    detect_restart,
    observe_health,
    stalled,
)

E = HealthEvent
POLLS = {
    # id: the health polls' answers -> the events they give, in order
    "waits-once-then-healthy": ([False, False, True], [E.WAITING, E.NONE, E.HEALTHY]),
    "steady": ([True, True], [E.HEALTHY, E.NONE]),
    "flap-is-a-suspected-restart": ([True, False, False, True], [E.HEALTHY, E.UNHEALTHY, E.NONE, E.BACK]),
    "no-waiting-after-it-was-healthy": ([True, False, True, False], [E.HEALTHY, E.UNHEALTHY, E.BACK, E.UNHEALTHY]),
}


@pytest.mark.parametrize(("answers", "events"), list(POLLS.values()), ids=list(POLLS))
def test_observe_health(answers: list[bool], events: list[HealthEvent]) -> None:
    health, seen = EngineHealth(), []
    for healthy in answers:
        health, event = observe_health(health, healthy)
        assert health.healthy is healthy
        seen.append(event)
    assert seen == events
    assert health.suspect_restart is (E.BACK in events)
    assert not health.looked().suspect_restart


A = DesiredAdapter(name="a", source="https://h/a.tgz")
LOADED = AdapterState("a", Phase.LOADED, loaded=identity_of(A), loaded_path="/x")
FLAPPED = EngineHealth(healthy=True, seen_healthy=True, suspect_restart=True)
STEADY = EngineHealth(healthy=True, seen_healthy=True)

RESTARTS = {
    # id: (actual, state, health) -> restart
    "held-no-restart": ({"a": "/x"}, {"a": LOADED}, FLAPPED, None),
    "vanished": ({}, {"a": LOADED}, STEADY, Restart(["a"], "adapters vanished from /v1/models")),
    "vanished-after-a-flap": ({}, {"a": LOADED}, FLAPPED, Restart(["a"], "health flapped")),
    "a-flap-alone-is-no-restart": ({}, {"a": AdapterState("a", Phase.PENDING)}, FLAPPED, None),
    "busy-is-not-lost": ({}, {"a": AdapterState("a", Phase.LOADED, loaded=identity_of(A), busy=True)}, STEADY, None),
}


@pytest.mark.parametrize(("actual", "state", "health", "restart"), list(RESTARTS.values()), ids=list(RESTARTS))
def test_detect_restart(
    actual: dict[str, str], state: dict[str, AdapterState], health: EngineHealth, restart: Restart | None
) -> None:
    assert detect_restart(actual, state, health) == restart


@pytest.mark.parametrize(
    ("age_s", "error"),
    [(10.0, None), (100.0, None), (101.0, "reconcile loop stalled for 101s")],
    ids=["turning", "at-the-limit", "stalled"],
)
def test_stalled_after_three_waits_and_ten_seconds(age_s: float, error: str | None) -> None:
    assert stalled(age_s, resync_s=30.0, health_poll_s=2.0) == error
