"""Prefer the backend that was recently sent this prompt's leading blocks for the same adapter.

vLLM reuses the KV blocks of a prompt prefix it computed before (automatic prefix caching), and
its block hash covers the adapter, so the cache helps a request only on the replica that computed
its prefix for that adapter. With placement a busy adapter lives on several replicas; among them
this scorer keeps a conversation, or any family of prompts sharing a long head, where its head was
computed, instead of letting load alone spread it.

The router sees text, not tokens, so the blocks are approximate (``block_hashes``): the prompt's
text (``RequestBody.prompt``: a completions ``prompt``, or each chat message's role and content in
order, so a conversation that resends its history starts with the previous turn's text) is cut
into ``BLOCK_CHARS`` = 64-character blocks, about 16 tokens at ~4 characters a token, vLLM's
default block size. Token and character boundaries differ, so a match says "probably cached", not
"cached"; only whole blocks count (a prompt under 64 characters has none), and only the first
``MAX_BLOCKS`` = 128 (8192 characters) are hashed, which bounds the CPU per request. The hashes are
chained as vLLM's are (each block's hash covers every block before it), with blake2b, never
Python's ``hash()``, which changes per process; the chain starts from a hash of the model name
(the adapter), so the same text for another adapter shares no block.

Score: the fraction of the request's blocks that form the longest leading run present in the
backend's ``PrefixIndex``, in [0, 1] (0 without blocks, as for a short prompt). Reads:
``prepared`` (the request's hashes, which ``PrefixScorer.prepare`` computed once per request) and
the scorer's own index per backend ``id``.

State (``PrefixScorer``, a stateful scorer: ``policy.ScorerHooks``): the scorer owns both its data
and its memory. ``prepare`` hashes a request's prompt once, before any decision; ``on_bind``
inserts the blocks into the bound backend's index (created then); ``on_backend_reset`` (the
backend left or went down: an engine that comes back may be a new one, its prefix cache empty)
drops that backend's index. Nothing else in the router knows about prefixes; built only when its
weight is above 0, so with the scorer off no prompt is hashed.

Weight: off unless ``--prefix-weight W`` (``PolicyParams.prefix_weight``, 0 by default); the flag
alone gives ``PREFIX_WEIGHT`` = 1.5, placed between least-load's 1 and lora-affinity's level gap
of 2.0 (levels 0.2 apart x weight 10). Above 1: a conversation whose history is all on one replica
(score near 1, worth up to 1.5) stays there over any load difference least-load can express (at
most 1: the idlest against the busiest candidate); a hot session's replica is still capped by the
bounded-load filter, which runs before any scorer. Below 2: the prefix alone never moves a request
down an affinity level (an active adapter at 10 beats a warm one with the whole prefix at 8 + 1.5);
two levels apart (4.0, active against cold) nothing overturns affinity, all other scorers together
being worth 3.3; one level apart the lower level wins only when load, KV and the hash together
lean its way by more than 0.5 (2.0 - 1.5) as well: a warm adapter on an idle replica that holds
the conversation, whose activation is free. So lora-affinity keeps deciding the grouping.

The index (``PrefixIndex``): per backend an LRU of at most ``INDEX_BLOCKS`` = 16384 hashes (256k
tokens at 16 a block, the order of one replica's KV cache). Each hash is an 8-byte integer (128 KiB
of payload per backend); in CPython an ``OrderedDict`` entry and its int cost about 180 bytes
(measured with tracemalloc), so about 3 MiB per backend at the bound. A bind inserts the request's
blocks as most recent, the first block last, so eviction takes a prompt's tail before its head, as
vLLM frees a request's blocks tail first; a backend that leaves takes its index with it (one that
goes down forgets it: ``on_backend_reset``). Per request: at most 128 chained blake2b hashes (~0.5 us a block on the
shared 2-core machine: ~8 us for 1000 characters, ~70 us at the cap), one membership test per
candidate and leading block matched, and at most 128 index updates at bind (~7 us). Pure; nothing
here logs, and neither prompt text nor hashes go into logs or metric labels.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Container, Mapping, Sequence
from functools import lru_cache

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import PolicyParams, ScorerPlugin
from lorapool.router.core.policy import ScorerHooks

BLOCK_CHARS = 64  # ~16 tokens at ~4 characters a token (vLLM's default --block-size 16)
MAX_BLOCKS = 128  # hashed per request: bounds the CPU (8192 characters of prompt)
INDEX_BLOCKS = 16384  # hashes remembered per backend (about 3 MiB in CPython, 8 bytes of payload each)
PREFIX_WEIGHT = 1.5  # --prefix-weight given alone (the module docstring says why)
_DIGEST_BYTES = 8
NAME = "prefix"


@lru_cache(maxsize=4096)
def _seed(model: str) -> bytes:
    """The chain's start for ``model``: fixed length, so no model name and text can run together."""
    return hashlib.blake2b(model.encode(), digest_size=_DIGEST_BYTES, person=b"lorapool-prefix").digest()


def block_hashes(model: str, text: str) -> tuple[int, ...]:
    """The chained hashes of the first ``MAX_BLOCKS`` whole ``BLOCK_CHARS`` blocks of ``text``,
    salted by ``model``; () when the text holds no whole block."""
    end = min(len(text) // BLOCK_CHARS, MAX_BLOCKS) * BLOCK_CHARS
    if not end:
        return ()
    blake2b, to_int = hashlib.blake2b, int.from_bytes  # ~0.5 us a block, most of it blake2b's
    parent = _seed(model)
    hashes = []
    for start in range(0, end, BLOCK_CHARS):
        parent = blake2b(parent + text[start : start + BLOCK_CHARS].encode(), digest_size=_DIGEST_BYTES).digest()
        hashes.append(to_int(parent, "big"))
    return tuple(hashes)


class PrefixIndex:
    """One backend's recently bound block hashes: an LRU of at most ``capacity`` (not thread-safe)."""

    __slots__ = ("_recent", "capacity")

    def __init__(self, capacity: int = INDEX_BLOCKS) -> None:
        if capacity < 1:
            raise ValueError(f"a prefix index holds at least 1 hash, got capacity={capacity}")
        self.capacity = capacity
        self._recent: OrderedDict[int, None] = OrderedDict()  # least recent first

    def __contains__(self, block: object) -> bool:
        return block in self._recent

    def __len__(self) -> int:
        return len(self._recent)

    def insert(self, blocks: Sequence[int]) -> None:
        """A request with ``blocks`` was bound here: they become the most recent, its first block
        last (evicted after its tail); the least recent beyond ``capacity`` are forgotten."""
        recent = self._recent
        for block in reversed(blocks):
            if block in recent:
                recent.move_to_end(block)
            else:
                recent[block] = None
        while len(recent) > self.capacity:
            recent.popitem(last=False)

    def clear(self) -> None:
        """Forget every hash (the replica's cache is gone: it went down)."""
        self._recent.clear()


def leading_run(blocks: Sequence[int], index: Container[int]) -> int:
    """How many of ``blocks``, from the first, are in ``index`` without a gap."""
    run = 0
    for block in blocks:
        if block not in index:
            break
        run += 1
    return run


def blocks_of(req: Request) -> tuple[int, ...]:
    """The request's block hashes, as ``PrefixScorer.prepare`` kept them (() without)."""
    blocks = req.prepared.get(NAME, ())
    return blocks if isinstance(blocks, tuple) else ()


class PrefixScorer(ScorerHooks):
    """The scorer and its state: one ``PrefixIndex`` per backend id that a request was bound to."""

    name = NAME

    def __init__(self, capacity: int = INDEX_BLOCKS) -> None:
        PrefixIndex(capacity)  # refuses a bad capacity now, not at the first bind
        self.capacity = capacity
        self.indexes: dict[str, PrefixIndex] = {}

    def __call__(self, req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
        """Fraction of the request's blocks cached (probably) on each backend, as a leading run."""
        blocks = blocks_of(req)
        if not blocks:
            return {b.id: 0.0 for b in backends}
        empty: frozenset[int] = frozenset()
        return {b.id: leading_run(blocks, self.indexes.get(b.id, empty)) / len(blocks) for b in backends}

    def prepare(self, req: Request, prompt: str) -> tuple[int, ...] | None:
        """The prompt's chained block hashes, salted by the model (None: no whole block)."""
        return block_hashes(req.model, prompt) or None

    def on_bind(self, req: Request, backend: str) -> None:
        if blocks := blocks_of(req):
            index = self.indexes.get(backend)
            if index is None:
                index = self.indexes[backend] = PrefixIndex(self.capacity)
            index.insert(blocks)

    def on_backend_reset(self, backend: str) -> None:
        self.indexes.pop(backend, None)


def weight(params: PolicyParams) -> float:
    """The weight a policy gives the scorer: ``--prefix-weight`` (0: left out of the policy)."""
    return params.prefix_weight


PLUGIN = ScorerPlugin(
    NAME,
    lambda _params: PrefixScorer(),
    weight=PREFIX_WEIGHT,
    reads=("prepared",),
    weight_of=weight,
)
