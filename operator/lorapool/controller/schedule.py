"""When to reconcile which pool: the reconcile queue's decisions. Pure.

The operator's queue is split the way controller-runtime splits its workqueue from its
reconcilers: watch handlers (``controller.app``) only say "look at this pool again", the
reconciler (``controller.reconcile``) only reconciles one pool and returns a ``Result``, and
this module decides, over plain data and an explicit clock, when each pool runs next.
``controller.workqueue`` is the thin asyncio shell that applies these decisions.

Keys are pools, ``(namespace, name)``. Per key:

- **one run at a time**: a trigger while the pool reconciles asks for one more run after it; a
  burst of triggers folds into that one run;
- **windowed triggers** (engine pod events): at most one per key per window, the first at once,
  the rest folded into one at the window's end;
- **requeue**: a ``Result(requeue=True)`` runs the pool again, at once or ``after_s`` later;
- **backoff**: a reconcile that raised runs again after ``backoff_s`` (doubling per failure in a
  row, capped); triggers meanwhile fold into that retry; a success resets it;
- **resync**: every ``resync_s`` each known pool is triggered, whatever changed (drift
  correction); a pool is known from its first trigger until it is forgotten (deleted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

Key = tuple[str, str]  # (namespace, name) of a LoRAPool

NEVER = -math.inf


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of the queue when it returns (an exception asks for a backoff retry)."""

    requeue: bool = False  # run again although no watch event asked
    after_s: float | None = None  # with requeue: this long after the run ends; None: at once
    forget: bool = False  # the pool is gone: stop resyncing it


DONE = Result()


class RetryLater(Exception):
    """Raised by a reconcile that has already said what failed (a condition, an Event): the queue
    retries it with backoff like any failure, and logs the message in one line, not a traceback."""


@dataclass(frozen=True)
class QueueSettings:
    """The queue's timing; seconds throughout."""

    # Engine pod events (each sidecar report is one: a PATCH of its Pod's status) trigger at most one
    # reconcile of their pool per window. Reports change at most every 2 s per replica (the sidecar's
    # --report-interval-seconds), so with 16 replicas loading, pods alone would ask for 8 reconciles a second.
    window_s: float = 2.0
    backoff_base_s: float = 2.0  # the first retry after a failed reconcile
    backoff_max_s: float = 16.0  # retries double up to this (an API server restart takes about as long)
    resync_s: float = 60.0  # drift correction: every known pool this often (--resync-seconds)


@dataclass(frozen=True)
class Entry:
    """One pool's place in the queue."""

    due: float | None = None  # when its next run may start; None: no run asked
    running: bool = False
    failures: int = 0  # failed reconciles in a row
    hold_until: float = NEVER  # no run starts before this (the backoff after a failure)
    window_end: float = NEVER  # the last windowed trigger fired, or fires, at this time
    known: bool = True  # resynced; False once forgotten


def backoff_s(failures: int, settings: QueueSettings) -> float:
    """The wait before retry number ``failures`` (1, 2, ...): base, doubling, capped."""
    return min(settings.backoff_base_s * 2.0 ** max(failures - 1, 0), settings.backoff_max_s)


def _ask(entry: Entry, at: float) -> Entry:
    """A run asked for at ``at``: the earlier of it and a run already asked, never inside a backoff."""
    at = max(at, entry.hold_until)
    return replace(entry, due=at if entry.due is None else min(entry.due, at), known=True)


def trigger(entry: Entry | None, now: float) -> Entry:
    """A watch event (or the resync) asks for a run: at once, or after the running one."""
    return _ask(entry or Entry(), now)


def trigger_windowed(entry: Entry | None, now: float, window_s: float) -> Entry:
    """A windowed trigger: at once when none fired within ``window_s``, else once at the window's end."""
    entry = entry or Entry()
    if entry.window_end > now:
        return replace(entry, known=True)  # already folded into the window's trailing run
    at = max(now, entry.window_end + window_s)
    return _ask(replace(entry, window_end=at), at)


def finish(entry: Entry, outcome: Result | None, now: float, settings: QueueSettings) -> Entry:
    """A run ended at ``now``: with a ``Result``, or ``None`` when the reconcile raised."""
    entry = replace(entry, running=False)
    if outcome is None:
        failures = entry.failures + 1
        hold = now + backoff_s(failures, settings)
        return replace(entry, failures=failures, hold_until=hold, due=hold)
    entry = replace(entry, failures=0, hold_until=NEVER)
    if outcome.forget:
        entry = replace(entry, known=False)
    if outcome.requeue:
        at = now + (outcome.after_s or 0.0)
        entry = replace(entry, due=at if entry.due is None else min(entry.due, at))
    return entry


@dataclass(frozen=True)
class Schedule:
    """Every pool's entry and the next resync."""

    entries: Mapping[Key, Entry]
    resync_at: float

    def put(self, key: Key, entry: Entry) -> Schedule:
        """With ``entry`` for ``key``; an entry forgotten, idle and with no run asked is dropped."""
        entries = dict(self.entries)
        if entry.known or entry.running or entry.due is not None:
            entries[key] = entry
        else:
            entries.pop(key, None)
        return replace(self, entries=entries)

    def forget(self, key: Key) -> Schedule:
        """The pool was deleted: no resync of it (a run already asked still happens)."""
        entry = self.entries.get(key)
        return self if entry is None else self.put(key, replace(entry, known=False))


def start(schedule: Schedule, now: float, settings: QueueSettings) -> tuple[Schedule, tuple[Key, ...]]:
    """The keys to run now (marked running), after the resync's triggers when it is due."""
    entries = dict(schedule.entries)
    resync_at = schedule.resync_at
    if now >= resync_at:
        entries = {k: trigger(e, now) if e.known else e for k, e in entries.items()}
        resync_at = now + settings.resync_s
    ready = tuple(sorted(k for k, e in entries.items() if not e.running and e.due is not None and e.due <= now))
    for key in ready:
        entries[key] = replace(entries[key], running=True, due=None)
    return Schedule(entries, resync_at), ready


def next_wake(schedule: Schedule) -> float:
    """When ``start`` next has something to do: the earliest run asked of an idle key, or the resync."""
    dues = (e.due for e in schedule.entries.values() if not e.running and e.due is not None)
    return min(min(dues, default=math.inf), schedule.resync_at)
