"""Per-adapter wait queues: where requests that fit no backend's LoRA slots are held. Pure.

Grouping: a request whose adapter is not running anywhere with room waits in its adapter's
queue instead of being pushed onto a replica that would hold it behind other adapters. When
a slot frees, the queue whose head has waited longest binds first (FIFO across adapters), and
the rest of that adapter's queue then follows as hits on the same replica. A queue's ``rank``
(its adapter's priority class, ``api.traffic.PRIORITY_ORDER``: 0 critical) comes before age, so
a critical adapter's held requests bind before a standard one's however long those waited.
With fair dispatch (``core.fairness``) the scheduler's virtual token counters order the heads
instead, before rank and age.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    since_s: float
    seq: int
    item: T
    rank: int = 0


@dataclass
class WaitQueues(Generic[T]):
    """FIFO queues keyed by model, with one limit on the total."""

    limit: int
    _queues: dict[str, deque[_Entry[T]]] = field(default_factory=dict)
    _total: int = 0
    _seq: Iterator[int] = field(default_factory=count)

    def __len__(self) -> int:
        return self._total

    def depth(self, model: str) -> int:
        """Requests waiting for ``model``."""
        queue = self._queues.get(model)
        return len(queue) if queue else 0

    def depths(self) -> dict[str, int]:
        """Waiting requests per model (models with none are absent)."""
        return {m: len(q) for m, q in self._queues.items()}

    def push(self, model: str, item: T, now_s: float, rank: int = 0) -> bool:
        """Append (``rank``: lower binds first); False (nothing queued) when the total limit is reached."""
        if self._total >= self.limit:
            return False
        self._queues.setdefault(model, deque()).append(_Entry(now_s, next(self._seq), item, rank))
        self._total += 1
        return True

    def items(self, model: str) -> list[T]:
        """Every request waiting for ``model``, oldest first."""
        return [entry.item for entry in self._queues.get(model, ())]

    def head(self, model: str) -> T | None:
        """The oldest request for ``model``, without removing it."""
        queue = self._queues.get(model)
        return queue[0].item if queue else None

    def pop(self, model: str) -> T:
        """Remove and return the oldest request for ``model`` (KeyError when none)."""
        queue = self._queues[model]
        entry = queue.popleft()
        if not queue:
            del self._queues[model]
        self._total -= 1
        return entry.item

    def remove(self, model: str, item: T) -> bool:
        """Drop one request (it timed out or its client left); False if it was not queued."""
        queue = self._queues.get(model)
        if not queue:
            return False
        for entry in queue:
            if entry.item is item:
                queue.remove(entry)
                if not queue:
                    del self._queues[model]
                self._total -= 1
                return True
        return False

    def models_by_age(
        self,
        eligible: Callable[[str], bool] | None = None,
        order: Callable[[str, int], tuple[float, int]] | None = None,
    ) -> list[str]:
        """Models whose head may bind: the best rank first, then the longest-waiting head.
        ``order`` (fair dispatch): a sort key per (model, its head's rank) that comes before age."""
        heads = []
        for model, queue in self._queues.items():
            if eligible is None or eligible(model):
                head = queue[0]
                first = order(model, head.rank) if order is not None else (0.0, head.rank)
                heads.append((first, head.since_s, head.seq, model))
        heads.sort()
        return [m for *_, m in heads]

    def newest_of_rank(self, rank: int) -> tuple[str, T] | None:
        """The most recently queued request of ``rank`` (the one to shed first), or None."""
        best: tuple[int, str, T] | None = None
        for model, queue in self._queues.items():
            entry = queue[-1]
            if entry.rank == rank and (best is None or entry.seq > best[0]):
                best = (entry.seq, model, entry.item)
        return None if best is None else (best[1], best[2])
