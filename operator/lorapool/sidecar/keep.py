"""Which kept adapter trees to evict: the sidecar's keep-unloaded policy. Pure.

An unloaded adapter's files stay in the store (``lorapool.sources.store``, "kept") so that a
place-back loads without a download: vLLM 0.32/0.34 frees no engine memory at unload, so the
files are the only thing an unload could save, and disk is cheap next to a download. Kept
trees are bounded: ``evictions`` names those past the budget's age, then the least recently
used past its bytes; a tree a loaded adapter points at is never evicted (its bytes are spent
anyway, so they do not count). The executor (shell) reads the kept trees, calls ``evictions``
and deletes what it names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

# One home for the defaults: spec.sidecar.keepUnloaded (its description says why), also the flags'.
from lorapool.api.pool import DEFAULT_KEEP_UNLOADED_BYTES, DEFAULT_KEEP_UNLOADED_MAX_AGE_S


@dataclass(frozen=True)
class KeepBudget:
    """How much of the unloaded adapters' files to keep: ``max_bytes`` 0 keeps none (delete at unload)."""

    max_bytes: int = DEFAULT_KEEP_UNLOADED_BYTES
    max_age_s: float = DEFAULT_KEEP_UNLOADED_MAX_AGE_S

    @property
    def on(self) -> bool:
        return self.max_bytes > 0 and self.max_age_s > 0


class KeptTree(Protocol):
    """A kept tree as the store records it (``lorapool.sources.store.KeptTree``)."""

    @property
    def identity(self) -> str: ...  # adapter_identity(source, revision, sha256) it was downloaded for

    @property
    def digest(self) -> str: ...  # the store directory

    @property
    def bytes(self) -> int: ...

    @property
    def kept_at(self) -> float: ...  # wall clock seconds: when it was unloaded (its last use)


class EvictReason(StrEnum):
    OFF = "off"  # keeping is off
    AGE = "age"  # kept longer than max_age_s
    BYTES = "bytes"  # the least recently used, past max_bytes


@dataclass(frozen=True)
class Eviction:
    identity: str
    reason: EvictReason


def evictions(kept: Sequence[KeptTree], in_use: Collection[str], *, now: float, budget: KeepBudget) -> list[Eviction]:
    """The kept trees to evict, oldest first, each with why.

    ``in_use``: digests a loaded adapter (or a download under way) points at; never evicted.
    The rest: all when keeping is off; those older than ``max_age_s``; then the least recently
    kept until the others fit in ``max_bytes``.
    """
    out: list[Eviction] = []
    fresh: list[KeptTree] = []
    for tree in sorted(kept, key=lambda t: (t.kept_at, t.identity)):
        if tree.digest in in_use:
            continue
        if not budget.on:
            out.append(Eviction(tree.identity, EvictReason.OFF))
        elif now - tree.kept_at > budget.max_age_s:
            out.append(Eviction(tree.identity, EvictReason.AGE))
        else:
            fresh.append(tree)
    total = sum(t.bytes for t in fresh)
    for tree in fresh:
        if total <= budget.max_bytes:
            break
        out.append(Eviction(tree.identity, EvictReason.BYTES))
        total -= tree.bytes
    return out
