"""Several routers' books, shared so they decide as one (issue 43). Pure.

Each router binds requests from what it knows: its own in-flight requests (exact, immediate) and
the engines' metrics (everyone's, a poll old). With N routers that poll-old view is the problem:
two routers see the same free LoRA slot and bind two different adapters onto it, and the engine
thrashes. So each router publishes its books (``Entry``) to a shared store whenever they change:
per backend, the requests it bound (per adapter: a request for an adapter a backend does not run
yet is the claim on a slot), those not past prefill yet; the requests it holds per adapter; and
its demand on rate-limited adapters. Every router folds the others' entries (``PeerBooks``) into
each backend's view beside its own and the engines' metrics (``core.state``).

An entry lives until its TTL, on the store's clock for the store (a router that dies stops
refreshing it: its claims expire there) and on the reader's clock here (``expire``: a router that
lost the store keeps no peer's books longer than the TTL, and decides from its own books and the
engines' metrics, as one router does). Engine truth still wins: the metrics' foreign load is a floor
under the peers' (``BackendState.view`` takes the larger), and a report or poll corrects the rest.

Rate limits (``core.ratelimit``): with live peers, a router's share of an adapter's pool limit is
its share of the adapter's demand, ``demand_share``: a client pinned to one router by its
connection gets the whole limit there, and the shares still sum to one.

Fair dispatch (``core.fairness``): each entry carries the weighted service the router's own
dispatches gave each key so far; a peer adds what grew since it last heard to its own counters, so
every router orders held adapters by the service the whole pool gave them. Totals, not increments,
travel: a lost or repeated message counts nothing twice, and a restarted router (a new ``boot``)
starts from nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

FORMAT = 1
# Demand on an adapter decays with this time constant, seconds: long enough that a steady client's
# rate is stable between publishes, short enough that a client moving to another router moves its share.
DEMAND_TAU_S = 2.0
# A router whose own demand is this small a share of the total still gets it: a share never reaches
# 0, so a first request on a quiet router is not refused for a share it has not had time to earn.
MIN_SHARE = 0.02
# Fair dispatch's service published per entry: the keys charged most recently, at most this many.
MAX_SERVICE_KEYS = 1000
# Routers whose service totals are remembered (a rollout's old pods leave their totals behind).
MAX_ROUTERS_SERVED = 64


@dataclass(frozen=True, slots=True)
class BackendBooks:
    """One router's books on one backend: its bound requests, those still in prefill, per adapter."""

    load: int = 0
    prefilling: int = 0
    active: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Entry:
    """What one router publishes: its books per backend, its held requests and its demand."""

    router: str
    seq: int
    backends: Mapping[str, BackendBooks]
    held: Mapping[str, int] = field(default_factory=dict)  # adapter -> requests waiting in its queues
    demand: Mapping[str, float] = field(default_factory=dict)  # limited adapter -> requests asked per second
    # Fair dispatch: the weighted service this router's dispatches gave each key since it started
    # (``fairness.VirtualTokenCounter.served``, the keys charged last): peers add what grew to theirs.
    service: Mapping[str, float] = field(default_factory=dict)
    boot: str = ""  # this router process's start: a restarted router's seq and service start again
    # The oldest held request per adapter: (Unix time it began waiting, its class rank), so a router
    # about to bind a held request onto a freed slot lets an older or higher-class one elsewhere go first.
    heads: Mapping[str, tuple[float, int]] = field(default_factory=dict)


def encode(entry: Entry) -> bytes:
    """Compact JSON: a few hundred bytes for a router with dozens of adapters in flight."""
    doc: dict[str, Any] = {
        "v": FORMAT,
        "r": entry.router,
        "s": entry.seq,
        "b": {url: [b.load, b.prefilling, dict(b.active)] for url, b in entry.backends.items()},
    }
    if entry.held:
        doc["h"] = dict(entry.held)
    if entry.demand:
        doc["d"] = {m: round(rate, 4) for m, rate in entry.demand.items()}
    if entry.service:
        doc["f"] = {k: round(v, 3) for k, v in entry.service.items()}
    if entry.boot:
        doc["o"] = entry.boot
    if entry.heads:
        doc["q"] = {m: [round(since, 3), rank] for m, (since, rank) in entry.heads.items()}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(raw: bytes | str) -> Entry | None:
    """An entry, or None when unreadable (another format, a foreign key): never raises."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("v") != FORMAT:
            return None
        backends = {
            str(url): BackendBooks(int(v[0]), int(v[1]), {str(m): int(n) for m, n in dict(v[2]).items() if int(n) > 0})
            for url, v in dict(doc["b"]).items()
        }
        held = {str(m): int(n) for m, n in dict(doc.get("h") or {}).items()}
        demand = {str(m): float(r) for m, r in dict(doc.get("d") or {}).items() if math.isfinite(float(r))}
        service = {str(k): float(v) for k, v in dict(doc.get("f") or {}).items() if math.isfinite(float(v))}
        heads = {str(m): (float(v[0]), int(v[1])) for m, v in dict(doc.get("q") or {}).items()}
        return Entry(str(doc["r"]), int(doc["s"]), backends, held, demand, service, str(doc.get("o") or ""), heads)
    except (ValueError, TypeError, KeyError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class PeerLoad:
    """The other routers' books on one backend, summed."""

    load: int = 0
    prefilling: int = 0
    active: Mapping[str, int] = field(default_factory=dict)


NO_PEER_LOAD = PeerLoad()


class PeerBooks:
    """The other routers' latest entries, each kept until ``ttl_s`` after it arrived (reader's clock)."""

    def __init__(self, me: str, ttl_s: float) -> None:
        self.me, self.ttl_s = me, ttl_s
        self._entries: dict[str, tuple[Entry, float]] = {}  # router -> (entry, expires at)
        self._sums: dict[str, PeerLoad] | None = None
        # router -> its service per key, as last applied; kept past its entry's expiry (a router cut off
        # for a while comes back with the same totals, which must not count twice)
        self._served: dict[str, dict[str, float]] = {}
        self._service_deltas: dict[str, float] = {}  # key -> the peers' service not yet taken

    def __len__(self) -> int:
        return len(self._entries)

    def routers(self) -> list[str]:
        return sorted(self._entries)

    def update(self, entry: Entry, now_s: float) -> bool:
        """One entry (a publish heard, or read at a resync); True when the books changed. An older
        ``seq`` from the same router (a late message) only refreshes its lease."""
        if entry.router == self.me:
            return False
        old = self._entries.get(entry.router)
        if old is not None and entry.seq < old[0].seq and entry.boot == old[0].boot:
            self._entries[entry.router] = (old[0], now_s + self.ttl_s)
            return False
        self._entries[entry.router] = (entry, now_s + self.ttl_s)
        self._note_service(entry, restarted=old is not None and entry.boot != old[0].boot)
        changed = old is None or old[0].backends != entry.backends
        if changed:
            self._sums = None
        return changed

    def _note_service(self, entry: Entry, *, restarted: bool) -> None:
        """What a peer's dispatches added to each key's service since last heard (a restarted router
        starts from nothing: its first numbers are all new)."""
        seen = self._served.pop(entry.router, None) or {}
        self._served[entry.router] = seen  # the most recently heard last: the oldest go past the bound
        while len(self._served) > MAX_ROUTERS_SERVED:
            del self._served[next(iter(self._served))]
        if restarted:
            seen.clear()
        for key, total in entry.service.items():
            delta = total - seen.get(key, 0.0)
            if delta:
                self._service_deltas[key] = self._service_deltas.get(key, 0.0) + delta
            seen[key] = total

    def has_service(self) -> bool:
        return bool(self._service_deltas)

    def take_service(self) -> dict[str, float]:
        """The peers' service per key heard since the last call (fair dispatch adds it to its counters)."""
        deltas, self._service_deltas = self._service_deltas, {}
        return deltas

    def replace_all(self, entries: list[Entry], now_s: float) -> bool:
        """Every live entry the store holds (a resync): routers it no longer holds are gone (their TTL
        passed on the store's clock: dead, or cut off from the store). True when the books changed."""
        live = {e.router for e in entries if e.router != self.me}
        gone = [r for r in self._entries if r not in live]
        for router in gone:
            del self._entries[router]
        changed = bool(gone)
        for entry in entries:
            changed = self.update(entry, now_s) or changed
        if changed:
            self._sums = None
        return changed

    def expire(self, now_s: float) -> bool:
        """Drop entries past their TTL (the store was not heard from); True when any was dropped."""
        gone = [r for r, (_, until) in self._entries.items() if until <= now_s]
        for router in gone:
            del self._entries[router]
        if gone:
            self._sums = None
        return bool(gone)

    def clear(self) -> bool:
        had = bool(self._entries)
        self._entries.clear()
        self._sums = None
        return had

    def on(self, backend: str) -> PeerLoad:
        """The peers' books on ``backend``, summed (cached until the next change)."""
        if self._sums is None:
            self._sums = _sum(e for e, _ in self._entries.values())
        return self._sums.get(backend, NO_PEER_LOAD)

    def demand(self, model: str) -> float:
        """The peers' demand on ``model``, requests per second."""
        return sum(e.demand.get(model, 0.0) for e, _ in self._entries.values())

    def held(self, model: str) -> int:
        return sum(e.held.get(model, 0) for e, _ in self._entries.values())

    def heads(self) -> list[tuple[str, float, int]]:
        """Every peer's oldest held request per adapter: (adapter, since when, class rank)."""
        return [(m, since, rank) for e, _ in self._entries.values() for m, (since, rank) in e.heads.items()]


Order = Callable[[str, float, int], tuple[float, ...]]


def pool_order(counter: Callable[[str], float] | None) -> Order:
    """The pool's order of held requests (adapter, since when, class rank) -> a sort key: fair
    dispatch's counter first when it is on (``counter``), then class, then age, as one router orders them."""

    def by_class(model: str, since: float, rank: int) -> tuple[float, ...]:
        return (rank, since)

    def fair(model: str, since: float, rank: int) -> tuple[float, ...]:
        assert counter is not None
        return (counter(model), rank, since)

    return by_class if counter is None else fair


def peer_goes_first(
    mine: tuple[float, ...],
    heads: list[tuple[str, float, int]],
    order: Order,
    fits: Callable[[str], bool],
) -> bool:
    """Whether a peer's held request should take the slot this router is about to give its own held
    request (``mine``: its order key): one that comes first in the pool's order (``order``: class then
    age, or fair dispatch's counters) and whose adapter ``fits`` the slot. One router's queue is FIFO
    by class; several routers' queues are one only if each lets the others' older heads go first."""
    return any(order(m, since, rank) < mine and fits(m) for m, since, rank in heads)


def _sum(entries: Any) -> dict[str, PeerLoad]:
    loads: dict[str, int] = {}
    prefilling: dict[str, int] = {}
    active: dict[str, dict[str, int]] = {}
    for entry in entries:
        for url, books in entry.backends.items():
            loads[url] = loads.get(url, 0) + books.load
            prefilling[url] = prefilling.get(url, 0) + books.prefilling
            into = active.setdefault(url, {})
            for model, n in books.active.items():
                into[model] = into.get(model, 0) + n
    return {url: PeerLoad(loads[url], prefilling[url], active[url]) for url in loads}


class DemandMeter:
    """Requests asked per adapter, as an exponentially decayed rate (``DEMAND_TAU_S``)."""

    def __init__(self, tau_s: float = DEMAND_TAU_S) -> None:
        self.tau_s = tau_s
        self._level: dict[str, tuple[float, float]] = {}  # model -> (decayed count, at)

    def asked(self, model: str, now_s: float) -> None:
        self._level[model] = (self._at(model, now_s) + 1.0, now_s)

    def rate(self, model: str, now_s: float) -> float:
        return self._at(model, now_s) / self.tau_s

    def rates(self, now_s: float) -> dict[str, float]:
        """Every adapter's rate; those decayed to nothing are forgotten (bounded by the limited adapters)."""
        out = {}
        for model in list(self._level):
            rate = self.rate(model, now_s)
            if rate < 1e-3:
                del self._level[model]
            else:
                out[model] = rate
        return out

    def forget_except(self, models: Mapping[str, object]) -> None:
        for model in [m for m in self._level if m not in models]:
            del self._level[model]

    def _at(self, model: str, now_s: float) -> float:
        level, at = self._level.get(model, (0.0, now_s))
        return level * math.exp(-max(0.0, now_s - at) / self.tau_s)


def demand_share(mine: float, peers: float) -> float:
    """This router's share of a pool limit: its share of the demand, at least ``MIN_SHARE``, at most 1."""
    total = mine + peers
    if total <= 0:
        return 1.0
    return min(1.0, max(MIN_SHARE, mine / total))
