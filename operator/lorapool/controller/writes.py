"""How the operator writes at catalogue scale: a client-side rate limit, failed writes as a condition,
Events aggregated per pool. Pure (the clock is an argument); ``controller.reconcile`` does the I/O.

- **Rate limit**: every per-adapter status write takes a token from one bucket per operator process
  (``TokenBucket``, the shape of client-go's flowcontrol limiter). client-go's defaults (5 QPS, burst 10)
  would take 33 minutes to accept 10,000 adapters; controllers raise them. We use 100 QPS, burst 200:
  the issue's target (10,000 adapters Accepted within 90 s) needs more than 110 writes/s, the API
  server's Priority and Fairness still queues us behind its other clients if it is busy, and
  ``WRITE_CONCURRENCY`` writes in flight keep the operator's thread pool free for the reconciles.
- **Failed writes** (an object too large, a conflict, a forbidden write) become the pool's abnormal-true
  ``WriteFailed`` condition and a Warning Event naming what failed and what to do, never only a log line.
- **Events aggregate**: past ``PER_OBJECT_EVENTS`` adapter transitions in one pass, one Event on the
  pool per reason with the count ("1000 adapter(s) Loaded: a, b, c and 997 more"), not one per adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lorapool.api.status import Condition, ConditionType, condition

QPS, BURST = 100.0, 200  # per operator process; see the module docstring
WRITE_CONCURRENCY = 8  # per-adapter status writes in flight per pool
PER_OBJECT_EVENTS = 10  # adapter transitions in one pass still posted on each LoRAAdapter
MAX_NAMED = 5  # adapter names an aggregated Event spells out
MAX_FAILURES_NAMED = 3  # failed writes the WriteFailed condition spells out

# The API server's words for an object over its limit: 413 from the HTTP layer, 422 "Too long" from a
# ConfigMap's validation, 500 "etcdserver: request is too large" from etcd (1.5 MiB).
_TOO_LARGE_WORDS = ("too large", "too long", "request entity too large", "must have at most")


class TokenBucket:
    """A token bucket over an explicit clock: ``reserve`` takes one token and says how long to wait for it."""

    def __init__(self, qps: float = QPS, burst: int = BURST, now: float = 0.0) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps, self.burst = qps, burst
        self._tokens, self._at = float(burst), now

    def reserve(self, now: float) -> float:
        """Take a token (possibly one not yet refilled) and return the seconds until it is there."""
        self._tokens = min(float(self.burst), self._tokens + max(now - self._at, 0.0) * self.qps)
        self._at = max(now, self._at)
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps


@dataclass(frozen=True)
class WriteFailure:
    """One write the API server refused this pass."""

    verb: str  # apply, status, annotate
    kind: str
    name: str
    code: int  # HTTP status (0: no answer)
    detail: str  # the API server's message

    @property
    def reason(self) -> str:
        return classify(self.code, self.detail)


def classify(code: int, detail: str) -> str:
    """The CamelCase reason of a refused write, from its HTTP status and the API server's message."""
    text = detail.lower()
    if code == 413 or any(w in text for w in _TOO_LARGE_WORDS):
        return "TooLarge"
    return {409: "Conflict", 403: "Forbidden", 422: "Invalid", 429: "Throttled"}.get(code, "WriteError")


_ADVICE = {
    "TooLarge": "the object is over the API server's size limit (1 MiB a ConfigMap, ~1.5 MiB any object in "
    "etcd): split the adapters over more pools or report it as a bug",
    "Conflict": "another writer changed it; retried with backoff",
    "Forbidden": "the operator's ServiceAccount may not write it (see deploy/rbac.yaml), or the namespace is "
    "being deleted",
    "Invalid": "the API server refused its content",
    "Throttled": "the API server is overloaded; retried with backoff",
    "WriteError": "retried with backoff",
}


def write_failed_condition(failures: Sequence[WriteFailure], generation: int | None) -> Condition | None:
    """``WriteFailed`` (True) naming the first failures and their reason, or None when every write passed."""
    if not failures:
        return None
    first = failures[0]
    named = [f"{f.verb} {f.kind} {f.name}: {f.reason} ({f.code}): {f.detail[:300]}" for f in failures]
    message = "; ".join(named[:MAX_FAILURES_NAMED])
    if len(failures) > MAX_FAILURES_NAMED:
        message += f"; and {len(failures) - MAX_FAILURES_NAMED} more failed write(s)"
    message += f". {_ADVICE[first.reason]}"
    return condition(ConditionType.WRITE_FAILED, True, first.reason, message, generation)


@dataclass(frozen=True)
class AdapterEvent:
    """An Event one adapter's transition asks for."""

    adapter: str
    reason: str
    message: str
    type: str = "Normal"


@dataclass(frozen=True)
class PoolEvent:
    """An Event for the pool as a whole: ``count`` adapters made the same transition."""

    reason: str
    message: str
    type: str
    count: int


def aggregate(events: Sequence[AdapterEvent]) -> tuple[list[AdapterEvent], list[PoolEvent]]:
    """Few transitions: each on its adapter, as a user of one adapter expects. Many: one Event per
    (reason, type) on the pool, with the count and the first names (sorted), so a bulk apply posts a
    handful of Events, not thousands."""
    if len(events) <= PER_OBJECT_EVENTS:
        return list(events), []
    groups: dict[tuple[str, str], list[AdapterEvent]] = {}
    for event in events:
        groups.setdefault((event.reason, event.type), []).append(event)
    pooled = []
    for (reason, type_), group in sorted(groups.items()):
        names = sorted(e.adapter for e in group)
        shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
        first = min(group, key=lambda e: e.adapter)
        detail = f" (first, {first.adapter}: {first.message[:300]})" if type_ == "Warning" else ""
        pooled.append(PoolEvent(reason, f"{len(group)} adapter(s) {reason}: {shown}{detail}", type_, len(group)))
    return [], pooled


def fold_repeats(events: Sequence[tuple[str, str, str]]) -> list[PoolEvent]:
    """A pool's own Events (reason, message, type): a reason repeated past ``PER_OBJECT_EVENTS`` times in
    one pass (``AdapterFailed`` for 50 bad adapters at once) becomes one Event with the count."""
    counts: dict[tuple[str, str], int] = {}
    for reason, _, type_ in events:
        counts[(reason, type_)] = counts.get((reason, type_), 0) + 1
    out, folded = [], set()
    for reason, message, type_ in events:
        n = counts[(reason, type_)]
        if n <= PER_OBJECT_EVENTS:
            out.append(PoolEvent(reason, message, type_, 1))
        elif (reason, type_) not in folded:
            folded.add((reason, type_))
            out.append(PoolEvent(reason, f"{n} times {reason}; the first: {message[:300]}", type_, n))
    return out
