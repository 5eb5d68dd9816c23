"""The engine's health as the sidecar follows it, and how it tells that the engine restarted. Pure.

Two signs of a restart: the health check fails and comes back (``observe_health`` marks the
restart suspected), or adapters the sidecar loaded vanish from ``/v1/models``
(``detect_restart``); either way every adapter is loaded again (``core.diff`` sees them lost)
and the pod's readiness is earned again. The shell polls and lists; this module decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from lorapool.sidecar.core import AdapterState


class HealthEvent(StrEnum):
    """What one health poll changed (the shell logs it and acts on it)."""

    NONE = "none"
    HEALTHY = "healthy"  # healthy for the first time
    BACK = "back"  # healthy again after it was healthy before: a restart is suspected
    UNHEALTHY = "unhealthy"
    WAITING = "waiting"  # never healthy yet (said once)


@dataclass(frozen=True)
class EngineHealth:
    healthy: bool = False
    seen_healthy: bool = False  # it was healthy at least once since the sidecar started
    suspect_restart: bool = False  # it came back since the last reconcile looked
    waiting_said: bool = False

    def looked(self) -> EngineHealth:
        """A reconcile listed the adapters: a suspected restart is now confirmed or ruled out."""
        return replace(self, suspect_restart=False)


def observe_health(before: EngineHealth, healthy: bool) -> tuple[EngineHealth, HealthEvent]:
    """The health after one poll answered ``healthy``, and what changed."""
    after = replace(before, healthy=healthy)
    if healthy and not before.healthy:
        if before.seen_healthy:
            return replace(after, suspect_restart=True), HealthEvent.BACK
        return replace(after, seen_healthy=True), HealthEvent.HEALTHY
    if not healthy and before.healthy:
        return after, HealthEvent.UNHEALTHY
    if not healthy and not before.seen_healthy and not before.waiting_said:
        return replace(after, waiting_said=True), HealthEvent.WAITING
    return after, HealthEvent.NONE


def lost_adapters(actual: Mapping[str, str], state: Mapping[str, AdapterState]) -> list[str]:
    """Adapters we loaded that the engine no longer lists: the engine restarted under us."""
    return sorted(n for n, st in state.items() if st.loaded is not None and not st.busy and n not in actual)


@dataclass(frozen=True)
class Restart:
    lost: list[str]  # the adapters to load again
    cause: str  # for the log line


def detect_restart(
    actual: Mapping[str, str], state: Mapping[str, AdapterState], health: EngineHealth
) -> Restart | None:
    """A restart when adapters we loaded are gone from ``/v1/models``; its cause says whether health flapped."""
    if not (lost := lost_adapters(actual, state)):
        return None
    return Restart(lost, "health flapped" if health.suspect_restart else "adapters vanished from /v1/models")


def stalled(age_s: float, *, resync_s: float, health_poll_s: float) -> str | None:
    """Why /healthz fails: the reconcile loop has not turned for far longer than it waits; None while it turns."""
    limit = 3 * max(resync_s, health_poll_s) + 10
    return f"reconcile loop stalled for {age_s:.0f}s" if age_s > limit else None
