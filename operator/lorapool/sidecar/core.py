"""The sidecar's decisions, free of I/O: desired vs actual -> actions, checks, config, status, report.

``diff`` is level-based: it looks at the whole desired set, what the engine lists in
``/v1/models`` and what the sidecar remembers, and returns every action needed now.
The shell (``agent.py``) runs the actions and feeds the results back into ``state``.
Pure: no asyncio, no HTTP, no clock (``now`` is passed in), no global RNG. Its siblings,
one concept each and as pure: ``retry`` (failures, backoff and their messages), ``drain``
(adapters placement moved away), ``health`` (engine health and restarts), ``observations``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from lorapool.api import clock
from lorapool.api.adapterset import AdapterSet, DesiredAdapter
from lorapool.api.peft import AdapterConfig, same_base_model, vllm_rank_for
from lorapool.api.report import (
    ANNOTATION,
    SYNCED_CONDITION,
    AdapterReport,
    ReplicaReport,
    adapter_identity,
    encode,
    short_id,
)
from lorapool.api.report import ReplicaPhase as Phase
from lorapool.api.status import Condition, ConditionStatus


class Reason(StrEnum):
    """Why a load happens (log field and metric label)."""

    NEW = "new"  # not in the engine yet
    REVISION = "revision"  # source, revision or sha256 changed: hot swap in place
    LOST = "lost"  # we had loaded it and the engine no longer lists it (engine restart)
    ADOPT = "adopt"  # the engine lists it but we cannot tell what it holds: reload in place


UNLOAD = "unload"  # AdapterState.failed marker: the unload (not a load) is backing off


def identity_of(adapter: DesiredAdapter) -> str:
    return adapter_identity(adapter.source, adapter.revision, adapter.sha256)


@dataclass(frozen=True)
class AdapterState:
    """What the sidecar knows about one adapter between reconciles."""

    name: str
    phase: Phase = Phase.PENDING
    source: str | None = None  # redacted, for status
    revision: str | None = None
    loaded: str | None = None  # identity of what the engine holds, as far as we know
    loaded_path: str | None = None  # the lora_path the engine was given
    busy: bool = False  # an action is running for this adapter
    attempts: int = 0  # consecutive failures
    failed: str | None = None  # identity the failures were about; a new one retries at once
    next_retry_at: float | None = None
    error: str | None = None
    rank: int | None = None
    loaded_at: float | None = None


@dataclass(frozen=True)
class Load:
    name: str
    adapter: DesiredAdapter
    inplace: bool  # vLLM load_inplace: swap weights under the same name without dropping it
    reason: Reason


@dataclass(frozen=True)
class Unload:
    name: str
    in_engine: bool  # False: only forget it and drop its files


@dataclass(frozen=True)
class Wait:
    name: str
    until: float  # nothing to do for this adapter before this time (backoff)


Action = Load | Unload | Wait


def diff(
    desired: Mapping[str, DesiredAdapter],
    actual: Mapping[str, str],
    state: Mapping[str, AdapterState],
    now: float,
    *,
    stored: Collection[str] = (),
    hold: Collection[str] = (),
) -> list[Action]:
    """Actions that converge the engine to ``desired``.

    ``actual``: adapter name -> root path, as ``/v1/models`` lists them.
    ``stored``: names that have files in the adapter store.
    ``hold``: names whose desired entry is invalid: leave them exactly as they are.
    Unloads come first, then loads, then waits; busy adapters are skipped.
    """
    actions: list[Action] = []
    present = (set(actual) | set(state) | set(stored)) - set(desired) - set(hold)
    for name in sorted(present):
        st = state.get(name)
        if st is not None and st.busy:
            continue
        if (
            name in actual
            and st is not None
            and st.failed == UNLOAD
            and st.next_retry_at is not None
            and now < st.next_retry_at
        ):
            actions.append(Wait(name, st.next_retry_at))  # unloaded before, yet still listed: back off
            continue
        actions.append(Unload(name, in_engine=name in actual))
    loads: list[Action] = []
    for name in sorted(desired):
        adapter = desired[name]
        st = state.get(name) or AdapterState(name)
        if st.busy:
            continue
        want = identity_of(adapter)
        in_engine = name in actual
        if in_engine and st.loaded == want and (not actual[name] or actual[name] == st.loaded_path):
            continue  # converged
        if st.failed == want and st.next_retry_at is not None and now < st.next_retry_at:
            loads.append(Wait(name, st.next_retry_at))
            continue
        if in_engine:
            reason = Reason.ADOPT if st.loaded is None else Reason.REVISION
            loads.append(Load(name, adapter, inplace=True, reason=reason))
        else:
            reason = Reason.LOST if st.loaded is not None else Reason.NEW
            loads.append(Load(name, adapter, inplace=False, reason=reason))
    actions.extend(a for a in loads if isinstance(a, Load))
    actions.extend(a for a in loads if isinstance(a, Wait))
    return actions


def loaded_state(action: Load, identity: str, path: str, rank: int, *, source: str | None, now: float) -> AdapterState:
    """An adapter's state once the engine loaded ``action``'s adapter from ``path`` (still busy: its
    action's task clears that when it ends); ``source`` is shown redacted."""
    return AdapterState(
        action.name,
        Phase.LOADED,
        source,
        action.adapter.revision,
        loaded=identity,
        loaded_path=path,
        busy=True,
        rank=rank,
        loaded_at=now,
    )


def next_wake_s(
    state: Mapping[str, AdapterState], draining: Mapping[str, float], now: float, *, resync_s: float
) -> float:
    """Seconds until the next reconcile: the first retry or drain due, at most ``resync_s``, at least 50 ms."""
    wake = resync_s
    for st in state.values():
        if st.next_retry_at is not None and not st.busy:
            wake = min(wake, st.next_retry_at - now)
    for until in draining.values():
        wake = min(wake, until - now)
    return max(wake, 0.05)


@dataclass(frozen=True)
class Problem:
    reason: str  # metric label: rank | base-model | unservable
    message: str


def check_adapter(name: str, config: AdapterConfig, pool: AdapterSet) -> list[Problem]:
    """What stops this adapter from being served by this pool, each with the fix."""
    problems = [Problem("unservable", f"adapter {name!r}: {p}") for p in config.problems]
    if config.rank > pool.max_lora_rank and config.rank <= 512:
        problems.append(
            Problem(
                "rank",
                f"adapter {name!r}: rank {config.rank} exceeds the pool's max-lora-rank {pool.max_lora_rank}; "
                f"set spec.lora.maxLoraRank: {vllm_rank_for(config.rank)} or auto",
            )
        )
    if not same_base_model(pool.base_model, config.base_model):
        problems.append(
            Problem(
                "base-model",
                f"adapter {name!r}: trained on base model {config.base_model!r} but the pool serves "
                f"{pool.base_model!r}; retrain it on {pool.base_model} or attach it to a pool of that base model",
            )
        )
    return problems


@dataclass(frozen=True)
class ParsedConfig:
    adapters: AdapterSet
    rejected: Mapping[str, str] = field(default_factory=dict)  # name -> why its entry is refused


def parse_config(text: bytes, *, path: str) -> ParsedConfig:
    """Parse adapters.json. A bad document raises ValueError (keep the last good set); a bad
    entry only rejects that adapter, so one typo never blocks the others."""
    try:
        return ParsedConfig(AdapterSet.from_json(text))
    except ValidationError as whole:
        first_error = whole
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"config {path}: not valid JSON ({exc}); fix the ConfigMap or the operator that writes it"
        ) from exc
    entries = raw.get("adapters") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"config {path}: {_first(first_error)}; fix the ConfigMap or the operator that writes it")
    try:
        base = AdapterSet.model_validate({**raw, "adapters": []})
    except ValidationError as exc:
        raise ValueError(f"config {path}: {_first(exc)}; fix the ConfigMap or the operator that writes it") from exc
    good: list[DesiredAdapter] = []
    rejected: dict[str, str] = {}
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        label = str(entry.get("name")) if isinstance(entry, dict) and entry.get("name") else f"adapters[{i}]"
        try:
            adapter = DesiredAdapter.model_validate(entry)
        except ValidationError as exc:
            rejected[label] = f"adapter {label!r}: {_first(exc)}; fix this entry in the pool spec"
            continue
        if adapter.name in seen:
            rejected[label] = f"adapter {label!r}: listed twice; keep one entry per name"
            continue
        seen.add(adapter.name)
        good.append(adapter)
    return ParsedConfig(base.model_copy(update={"adapters": tuple(good)}), rejected)


def parse_slot(text: str | None) -> int | None:
    """This replica's placement slot from the downward-API file of annotation ``lorapool.io/slot``.

    Empty or missing (the operator has not assigned one yet) or unreadable: None, and the
    replica holds only the adapters placed on every replica until its slot arrives.
    """
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


def _first(exc: Any) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "document"
    return f"{where}: {err.get('msg', 'invalid')}"


def rfc3339(ts: float | None) -> str | None:
    return None if ts is None else clock.rfc3339(ts)


@dataclass(frozen=True)
class EngineView:
    url: str
    healthy: bool
    restarts: int


@dataclass(frozen=True)
class ConfigView:
    path: str
    error: str | None
    loaded_at: float | None


def status_document(
    engine: EngineView,
    config: ConfigView,
    pool: AdapterSet | None,
    state: Mapping[str, AdapterState],
    rejected: Mapping[str, str],
) -> dict[str, Any]:
    """The /status JSON (camelCase, RFC 3339 times)."""
    adapters: list[dict[str, Any]] = []
    for name in sorted(state):
        st = state[name]
        adapters.append(
            {
                "name": name,
                "source": st.source,
                "revision": st.revision,
                "phase": str(st.phase),
                "rank": st.rank,
                "error": rejected.get(name) or st.error,  # a held adapter shows why its entry is refused
                "loadedAt": rfc3339(st.loaded_at),
                "attempts": st.attempts,
                "nextRetryAt": rfc3339(st.next_retry_at),
            }
        )
    for name in sorted(set(rejected) - set(state)):
        adapters.append(
            {
                "name": name,
                "source": None,
                "revision": None,
                "phase": str(Phase.FAILED),
                "rank": None,
                "error": rejected[name],
                "loadedAt": None,
                "attempts": 0,
                "nextRetryAt": None,
            }
        )
    return {
        "engine": {"url": engine.url, "healthy": engine.healthy, "restarts": engine.restarts},
        "config": {"path": config.path, "error": config.error, "loadedAt": rfc3339(config.loaded_at)},
        "pool": pool.pool if pool else None,
        "baseModel": pool.base_model if pool else None,
        "maxLoraRank": pool.max_lora_rank if pool else None,
        "adapters": adapters,
    }


def summarize(actions: Sequence[Action]) -> dict[str, int]:
    """Counts per action kind, for the reconcile log line."""
    out = {"load": 0, "reload": 0, "unload": 0, "wait": 0}
    for a in actions:
        if isinstance(a, Load):
            out["reload" if a.inplace else "load"] += 1
        elif isinstance(a, Unload):
            out["unload"] += 1
        else:
            out["wait"] += 1
    return out


# ---- the report on the sidecar's own Pod (lorapool.api.report) -------------------------------


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
