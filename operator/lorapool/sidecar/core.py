"""The sidecar's decisions, free of I/O: desired vs actual -> actions, the pool's checks, /status.

``diff`` is level-based: it looks at the whole desired set, what the engine lists in
``/v1/models`` and what the sidecar remembers, and returns every action needed now. The
shell (``agent.py``, through ``executor.py``) runs the actions and feeds the results back into
``state``.
Pure: no asyncio, no HTTP, no clock (``now`` is passed in), no global RNG. Its siblings,
one concept each and as pure: ``config`` (adapters.json, the slot, re-reads), ``retry``
(failures, backoff and their messages), ``drain`` (adapters placement moved away), ``health``
(engine health and restarts), ``podreport`` (the report, its readiness condition, pacing) and
``observations`` (the engine's metrics over a window).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lorapool.api import clock
from lorapool.api.adapterset import AdapterSet, DesiredAdapter
from lorapool.api.peft import AdapterConfig, same_base_model, vllm_rank_for
from lorapool.api.report import ReplicaPhase as Phase
from lorapool.api.report import adapter_identity


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
    resolved: str | None = None  # what the source resolved to when fetched: an oci:// tag's digest, an hf:// commit


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
                "resolvedRevision": st.resolved,
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
