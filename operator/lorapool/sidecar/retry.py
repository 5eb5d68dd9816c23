"""How a failed adapter action is remembered and when it is tried again. Pure.

The shell (``executor.py``) reads what went wrong into a ``Failure`` (reason, message,
transient) and stores the ``AdapterState`` that ``after_failure`` / ``after_unload`` return,
waiting the delay they chose; ``core.diff`` waits while ``next_retry_at`` lies ahead and the
failed identity is still the one desired. No clock (``now`` is passed in), no global RNG.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from lorapool.api.report import ReplicaPhase as Phase
from lorapool.sidecar.core import UNLOAD, AdapterState


def backoff_s(attempts: int, rng: random.Random, *, base_s: float = 1.0, cap_s: float = 300.0) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(attempts-1))]."""
    ceiling = min(cap_s, base_s * 2 ** max(0, min(attempts - 1, 30)))
    return rng.uniform(0.0, ceiling)


def retry_delay_s(
    attempts: int, rng: random.Random, *, transient: bool, base_s: float = 1.0, cap_s: float = 300.0
) -> float:
    """How long a failed adapter waits before the same desired entry is tried again.

    Transient failures (a source or the engine unreachable, a 5xx, a timeout) back off
    exponentially with full jitter. Permanent ones (a missing object, a refused adapter, a bad
    checksum) will not heal by retrying: they wait near the cap (jittered in [cap/2, cap] so
    pods do not retry in step). A change of the desired entry retries at once either way,
    because ``diff`` only waits while the failed identity is still the one desired.
    """
    if transient:
        return backoff_s(attempts, rng, base_s=base_s, cap_s=cap_s)
    return rng.uniform(cap_s / 2, cap_s)


@dataclass(frozen=True)
class Backoff:
    """The retry settings: the first transient delay's ceiling and the cap, in seconds."""

    base_s: float = 1.0
    cap_s: float = 300.0


@dataclass(frozen=True)
class Failure:
    """What went wrong with one adapter action, as the shell read it from the error."""

    reason: str  # metric label: checksum | unsafe | invalid | download | engine | unload | internal | a Problem's
    message: str  # names the adapter and says what to fix
    transient: bool  # retrying the same thing soon can succeed


def about(name: str, message: str) -> str:
    """``message`` led by the adapter's name (once)."""
    return message if message.startswith(f"adapter {name!r}") else f"adapter {name!r}: {message}"


def internal_failure(name: str, kind: str, detail: str) -> Failure:
    """A bug in an adapter action (``kind``: the exception's type): retried, reported as a bug."""
    return Failure("internal", f"adapter {name!r}: internal error {kind}: {detail}; report a bug", transient=True)


@dataclass(frozen=True)
class Retry:
    """The state to remember after an action, and the delay it waits (for the log line)."""

    state: AdapterState
    delay_s: float


def after_failure(
    st: AdapterState, failed: str, failure: Failure, now: float, rng: random.Random, backoff: Backoff
) -> Retry:
    """``st`` after an action on identity ``failed`` (or ``UNLOAD``) failed: counted, backed off, explained.

    Attempts count consecutive failures of the same identity (a new desired entry starts at one);
    a failed new revision says the one loaded before keeps serving.
    """
    attempts = (st.attempts if st.failed == failed else 0) + 1
    delay = retry_delay_s(attempts, rng, transient=failure.transient, base_s=backoff.base_s, cap_s=backoff.cap_s)
    message = failure.message
    if st.loaded is not None and failed not in (st.loaded, UNLOAD):
        message += "; the previously loaded revision keeps serving"
    state = replace(st, phase=Phase.FAILED, attempts=attempts, failed=failed, next_retry_at=now + delay, error=message)
    return Retry(state, delay)


def after_unload(st: AdapterState, now: float, rng: random.Random, backoff: Backoff) -> Retry:
    """``st`` after the engine unloaded it: a short memory of the unload, so that an adapter the engine
    lists again (something else loads it, e.g. ``--lora-modules``) is unloaded with backoff, not in a
    tight loop, and says so from the second time on."""
    repeats = st.attempts + 1 if st.failed == UNLOAD else 1
    delay = backoff_s(repeats, rng, base_s=backoff.base_s, cap_s=backoff.cap_s)
    error = None
    if repeats > 1:
        error = (
            f"adapter {st.name!r}: the engine lists it again after {repeats - 1} unloads; "
            "remove it from the engine's --lora-modules or whatever else loads it"
        )
    state = replace(
        st,
        phase=Phase.UNLOADING,
        loaded=None,
        failed=UNLOAD,
        attempts=repeats,
        next_retry_at=now + delay,
        error=error,
    )
    return Retry(state, delay)
