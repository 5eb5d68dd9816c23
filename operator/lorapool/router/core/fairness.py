"""Fair dispatch: a virtual token counter per fairness key, weighted by priority class. Pure.

The Virtual Token Counter of Sheng et al. ("Fairness in Serving Large Language Models", OSDI 2024):
every key (today: the adapter) has a counter of the service it received, in weighted tokens;
when requests wait, the key with the smallest counter dispatches next. Two rules make it fair
and work-conserving:

- a dispatch charges its key ``prompt_weight x prompt + output_weight x output`` tokens (1 and 2,
  the paper's: a decoded token costs about two prefilled ones), divided by the key's class
  weight (``CLASS_WEIGHTS``). The output is not known at dispatch, so the request's
  ``max_tokens`` (else ``DEFAULT_OUTPUT_ESTIMATE``) is charged then and the difference to the
  engine's usage is settled when the response ends (``correct``): a burst of dispatches counts
  at once, not only as its requests finish;
- a key that starts waiting (its queue was empty) is lifted to at least the smallest counter
  among the keys already waiting (none waiting: the counter of the last dispatch), so idle time
  banks no credit: a tenant that was quiet for an hour cannot then starve the others for one.

With those, two keys that stay backlogged receive service within ``bound(...)`` of each other
(the paper's Theorem 4.4: 2 x the largest single charge), whatever the other keys send; a key
that sends little is served almost at once when it does send. ``Scheduler`` asks ``order`` for
which held adapter binds next and still binds late by adapter (grouping is unchanged: a held
request binds only where the strict policy lets it), so fairness decides *which* adapter's
requests go next, never onto which replica.

With several routers and shared books (``core.books``), each adds the service the others' dispatches
gave (``add_peers``), so the counters are the pool's, not one router's share of it.

Memory: one float per key, at most ``max_keys`` keys (the least recently charged one goes first;
losing a counter only means the key restarts at the floor).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lorapool.api.traffic import Priority

# Service shares under saturation: a critical adapter gets up to 4x a sheddable one's and 2x a
# standard one's when all are backlogged; none is starved (that is what strict priority would do,
# and a team that marks itself critical would then own the pool).
CLASS_WEIGHTS: Mapping[Priority, float] = {Priority.CRITICAL: 4.0, Priority.STANDARD: 2.0, Priority.SHEDDABLE: 1.0}
PROMPT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0
# Output tokens charged at dispatch for a request without max_tokens (corrected at its end).
DEFAULT_OUTPUT_ESTIMATE = 256
MAX_KEYS = 100_000


def cost(prompt_tokens: int, output_tokens: int) -> float:
    """A request's service in unweighted virtual tokens."""
    return PROMPT_WEIGHT * max(0, prompt_tokens) + OUTPUT_WEIGHT * max(0, output_tokens)


def estimate(prompt_tokens: int, max_tokens: int | None) -> float:
    """What a request is charged when it binds: its prompt and its max_tokens (else the default)."""
    return cost(prompt_tokens, DEFAULT_OUTPUT_ESTIMATE if max_tokens is None else max_tokens)


def bound(largest_cost: float, weight: float = CLASS_WEIGHTS[Priority.STANDARD]) -> float:
    """The most two backlogged keys' counters can differ (the paper's 2 x the largest charge)."""
    return 2.0 * largest_cost / weight


@dataclass
class VirtualTokenCounter:
    """Counters per key; the scheduler calls ``backlogged``, ``charge``, ``correct`` and ``order``."""

    max_keys: int = MAX_KEYS
    _counters: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _floor: float = 0.0  # the counter of the last dispatch: where a key starts with no one waiting
    _largest: float = 0.0  # the largest weighted charge so far (``bound``'s largest single charge)
    # The weighted service this router's own dispatches gave each key (charges and corrections), the
    # most recent last: what shared books publish for the other routers' counters (``served_recently``).
    _served: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._counters)

    def counter(self, key: str) -> float:
        """The key's weighted service so far (the floor for a key never charged)."""
        return self._counters.get(key, self._floor)

    def backlogged(self, key: str, waiting: Iterable[str]) -> None:
        """``key`` starts waiting (its queue was empty); ``waiting``: the keys already waiting."""
        lift = min((self.counter(k) for k in waiting if k != key), default=self._floor)
        self._set(key, max(self.counter(key), lift))

    def charge(self, key: str, service: float, priority: Priority) -> None:
        """A request of ``key`` dispatched, costing ``service`` unweighted tokens (``cost``)."""
        weighted = service / CLASS_WEIGHTS[priority]
        self._largest = max(self._largest, weighted)
        value = self.counter(key) + weighted
        self._set(key, value)
        self._floor = value
        self._serve(key, weighted)

    def correct(self, key: str, charged: float, used: float, priority: Priority) -> None:
        """A response ended: replace the estimate charged at dispatch by the service it used."""
        if key in self._counters:
            delta = (used - charged) / CLASS_WEIGHTS[priority]
            self._set(key, max(0.0, self._counters[key] + delta))
            self._serve(key, delta)

    def add_peers(self, served: Mapping[str, float]) -> None:
        """The other routers' dispatches gave each key this much weighted service (shared books,
        ``core.books``): counted as if this router had dispatched it, so every router orders the
        keys by the pool's service, not by its own share of it."""
        for key, delta in served.items():
            value = max(0.0, self.counter(key) + delta)
            self._set(key, value)
            if delta > 0:
                self._largest = max(self._largest, delta)
                self._floor = value

    def served_recently(self, limit: int) -> dict[str, float]:
        """This router's own service per key, for the ``limit`` keys charged last."""
        keys = list(self._served)[-limit:]
        return {k: self._served[k] for k in keys}

    def _serve(self, key: str, weighted: float) -> None:
        self._served[key] = self._served.get(key, 0.0) + weighted
        self._served.move_to_end(key)
        while len(self._served) > self.max_keys:
            self._served.popitem(last=False)

    def ahead(self, key: str, behind: Iterable[str]) -> bool:
        """True when ``key`` received more than the bound's worth of service beyond one of the
        ``behind`` keys (waiting for something only ``key`` can give up, a LoRA slot): then
        ``key`` waits, so the gap never grows past the bound (``bound``, with the largest charge)."""
        least = min((self.counter(k) for k in behind if k != key), default=None)
        return least is not None and self.counter(key) > least + 2.0 * self._largest

    def order(self, key: str, rank: int) -> tuple[float, int]:
        """Sort key of a waiting key: the smallest counter first, ties to the higher class."""
        return (self.counter(key), rank)

    def _set(self, key: str, value: float) -> None:
        self._counters[key] = value
        self._counters.move_to_end(key)
        while len(self._counters) > self.max_keys:
            self._counters.popitem(last=False)
