"""The report on the sidecar's own Pod (``lorapool.api.report``): what it says, the readiness
condition it carries, and when it is written. Pure.

``replica_report`` reads the adapters' states into the annotation's ``ReplicaReport``;
``next_readiness`` keeps the readiness latch (set by the first sync, cleared by an engine
restart) and builds the pod condition ``SYNCED_CONDITION`` as the operator's own condition model
(``lorapool.api.status.Condition``); ``pod_patch`` puts both in one patch; ``Pacer`` decides
when the shell (``reporter.Reporter``) sends it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from lorapool.api import clock
from lorapool.api.adapterset import DesiredAdapter
from lorapool.api.report import ANNOTATION, SYNCED_CONDITION, AdapterReport, ReplicaReport, encode, short_id
from lorapool.api.report import ReplicaPhase as Phase
from lorapool.api.status import Condition, ConditionStatus
from lorapool.sidecar.core import AdapterState, identity_of


def replica_report(
    desired: Mapping[str, DesiredAdapter],
    state: Mapping[str, AdapterState],
    rejected: Mapping[str, str],
    *,
    engine_healthy: bool,
) -> ReplicaReport:
    """What this replica holds, per adapter: phase, the desired identity, the loaded one, why it failed.

    Only facts that change when the engine's holdings change go in (no attempt counts, no
    retry times), so an idle sidecar produces the same report and writes nothing.
    """
    adapters: dict[str, AdapterReport] = {}
    for name, st in state.items():
        want = desired.get(name)
        adapters[name] = AdapterReport(
            phase=st.phase,
            id=short_id(identity_of(want)) if want is not None else None,
            loaded=short_id(st.loaded) if st.loaded else None,
            message=st.error if st.phase == Phase.FAILED else None,
            revision=st.resolved if st.loaded else None,
        )
    for name, why in rejected.items():
        if name not in adapters:
            adapters[name] = AdapterReport(phase=Phase.FAILED, message=why)
    return ReplicaReport(engine_healthy=engine_healthy, adapters=adapters)


@dataclass(frozen=True)
class Synced:
    """The ``lorapool.api.report.SYNCED_CONDITION`` pod condition: the engine pod's readiness gate."""

    status: bool
    reason: str
    message: str


def first_sync_done(
    desired: Collection[str], state: Mapping[str, AdapterState], *, engine_healthy: bool, config_read: bool
) -> bool:
    """True once every desired adapter was loaded or failed at least once (failures count: one
    broken adapter fails on every replica alike and must not keep them all out of the Service)."""
    if not (engine_healthy and config_read):
        return False
    return all((st := state.get(n)) is not None and st.phase in (Phase.LOADED, Phase.FAILED) for n in desired)


def synced_condition(latched: bool, desired: Collection[str], state: Mapping[str, AdapterState]) -> Synced:
    """The condition from the latch (set by the first sync, cleared by an engine restart) and counts."""
    counts = {Phase.LOADED: 0, Phase.FAILED: 0}
    for name in desired:
        st = state.get(name)
        if st is not None and st.phase in counts:
            counts[st.phase] += 1
    busy = len(desired) - counts[Phase.LOADED] - counts[Phase.FAILED]
    message = f"{counts[Phase.LOADED]} loaded, {counts[Phase.FAILED]} failed, {busy} in progress of {len(desired)}"
    if not latched:
        return Synced(False, "Syncing", message)
    return Synced(True, "SyncedWithFailures" if counts[Phase.FAILED] else "Synced", message)


def synced_pod_condition(synced: Synced, previous: Condition | None, now: str) -> Condition:
    """``synced`` as the pod condition ``SYNCED_CONDITION``, in the operator's condition model
    (``lorapool.api.status.Condition``); ``lastTransitionTime`` is carried over from ``previous``
    while the status stays the same, and is ``now`` (RFC 3339) when it changes, as the operator's
    ``merge_conditions`` does for its own conditions."""
    status = (ConditionStatus.TRUE if synced.status else ConditionStatus.FALSE).value
    stamp = previous.last_transition_time if previous is not None and previous.status == status else None
    return Condition(
        type=SYNCED_CONDITION,
        status=status,
        reason=synced.reason,
        message=synced.message,
        last_transition_time=stamp or now,
    )


@dataclass(frozen=True)
class Readiness:
    """The readiness latch (set by the first sync, cleared by an engine restart) and the condition last built."""

    latched: bool = False
    shown: Condition | None = None

    def restarted(self) -> Readiness:
        """The engine restarted: readiness is earned again once everything is held again."""
        return replace(self, latched=False)


def next_readiness(
    before: Readiness,
    desired: Collection[str],
    state: Mapping[str, AdapterState],
    *,
    engine_healthy: bool,
    config_read: bool,
    now: float,
) -> tuple[Readiness, Condition]:
    """The latch, and the pod condition for the report built at ``now``."""
    latched = before.latched or first_sync_done(desired, state, engine_healthy=engine_healthy, config_read=config_read)
    condition = synced_pod_condition(synced_condition(latched, desired, state), before.shown, clock.rfc3339(now))
    return Readiness(latched, condition), condition


def pod_patch(report: ReplicaReport, condition: Condition) -> dict[str, Any]:
    """The strategic-merge patch of the Pod's status: the report annotation and the readiness condition."""
    return {
        "metadata": {"annotations": {ANNOTATION: encode(report)}},
        "status": {"conditions": [condition.to_wire()]},
    }


@dataclass(frozen=True)
class Pacer:
    """When to write the report: never while it is unchanged, at most once per ``min_interval_s``.

    Pure: the shell asks ``next_write_at`` with the document it would send and the time, and
    tells ``sent`` / ``failed`` what happened. A failed write is retried after ``retry_s``
    (doubling up to ``max_retry_s``) with whatever the document is by then.
    """

    min_interval_s: float = 2.0
    retry_s: float = 1.0
    max_retry_s: float = 30.0
    last_sent: str | None = None
    last_at: float | None = None
    failures: int = 0

    def next_write_at(self, document: str, now: float) -> float | None:
        """None: nothing to write; else when the write is due (``now`` or later)."""
        if document == self.last_sent:
            return None
        if self.last_at is None:
            return now
        gap = self.min_interval_s
        if self.failures:
            gap = max(gap, min(self.max_retry_s, self.retry_s * 2 ** (self.failures - 1)))
        return max(now, self.last_at + gap)

    def sent(self, document: str, now: float) -> Pacer:
        return replace(self, last_sent=document, last_at=now, failures=0)

    def failed(self, now: float) -> Pacer:
        return replace(self, last_at=now, failures=self.failures + 1)
