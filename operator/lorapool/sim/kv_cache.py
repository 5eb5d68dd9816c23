"""The simulated engine's paged KV cache: free blocks and automatic prefix caching. Pure.

No clock, no I/O. ``engine.Engine`` (the only caller) owns one ``KVCache``: it looks up a
waiting request's cached prefix and shares it at admission, takes the blocks each scheduled
chunk needs, registers the prompt blocks a chunk fills and releases a request's blocks when it
finishes, aborts or is preempted. A request's block table (``BlockOwner``: its blocks, the
cached blocks it holds, how many of its prompt blocks are registered) lives on the request and
is written here only.

Automatic prefix caching (``--enable-prefix-caching``, on by default in V1), as vLLM 0.32.0's
``vllm/v1/core/{kv_cache_manager,block_pool,single_type_kv_cache_manager}.py`` (0.34.0 the
same for what is modelled): a request carries the chained hashes of its prompt's full blocks
(``SimRequest.block_hashes``, computed by the shell with the adapter's name and path as salt);
at admission the longest run of its leading blocks found in the cache is shared by reference
(at most ``(tokens - 1) // block_size`` blocks: the last token is always computed), prefill
starts after them, so the step's prefill time covers only the uncached tokens; a scheduled
chunk registers the blocks it fills; a freed cached block stays evictable, counts as free and
is evicted least recently freed first (a request's tail block first) once no uncached free
block is left.

Where it is simpler than vLLM's: only prompt blocks are hashed (vLLM also caches the blocks a
request's output fills, so a preempted request or a conversation resending the reply can hit
more there); a block computed while a running request holds the same one stays uncached, and a
recomputed copy of an evictable block replaces it (vLLM caches every copy under the one hash,
so the hash outlives a copy's eviction); no sub-block hits, sliding windows or KV connectors;
hashes are 64 bits.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

_NO_HIT = (0, 0)  # no cached blocks, none of them evictable


class BlockOwner(Protocol):
    """A request's block table as the KV cache reads and writes it (``engine.SimRequest``)."""

    block_hashes: tuple[int, ...]  # chained hashes of the prompt's full blocks
    prefill_len: int  # tokens to prefill
    blocks: int  # KV blocks it holds, cached ones included
    held: list[int]  # hashes of the cached blocks it references
    registered: int  # leading block_hashes it has hit or computed


class KVCache:
    """The KV blocks of one replica: how many are free, and the prefix cache over them."""

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.free_blocks = num_blocks  # free KV blocks, evictable cached ones included
        # The prefix cache: block hash -> requests referencing the block (0: evictable), and the
        # evictable ones in vLLM's free-queue order (least recently freed first, evicted first).
        self._cached: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def usage(self) -> float:
        """Fraction of KV blocks in use, as vllm:kv_cache_usage_perc (1.0 = full)."""
        return (self.num_blocks - self.free_blocks) / self.num_blocks

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """Leading blocks of ``block_hashes`` the prefix cache holds (in use or evictable)."""
        hit = 0
        while hit < len(block_hashes) and block_hashes[hit] in self._cached:
            hit += 1
        return hit

    def evictable_blocks(self) -> tuple[int, ...]:
        """Hashes of cached blocks no request references, the next to be evicted first."""
        return tuple(self._evictable)

    def lookup(self, req: BlockOwner) -> tuple[int, int]:
        """The request's leading blocks in the cache, and how many of them are evictable.

        As vLLM's ``get_computed_blocks``: the hit stops at the first miss (hashes are chained)
        and covers at most ``prefill_len - 1`` tokens, so the last token is computed for logits."""
        hashes = req.block_hashes
        if not self.caching or not hashes:
            return _NO_HIT
        limit = min(len(hashes), (req.prefill_len - 1) // self.block_size)
        cached = self._cached
        hit = touched = 0
        while hit < limit:
            refs = cached.get(hashes[hit])
            if refs is None:
                break
            touched += not refs
            hit += 1
        return hit, touched

    def reference(self, req: BlockOwner, hit: int) -> None:
        """Share the first ``hit`` cached blocks with the request (vLLM's ``touch``)."""
        cached, evictable = self._cached, self._evictable
        hashes = req.block_hashes
        for i in range(hit):
            block_hash = hashes[i]
            refs = cached[block_hash]
            if not refs:
                del evictable[block_hash]
            cached[block_hash] = refs + 1
            req.held.append(block_hash)
        req.registered = hit

    def register(self, req: BlockOwner, computed_tokens: int) -> None:
        """Cache the prompt blocks full once ``computed_tokens`` are computed. vLLM caches them
        when it schedules their tokens, so a request admitted later in the same step hits them."""
        hashes = req.block_hashes
        end = min(computed_tokens // self.block_size, len(hashes))
        cached, evictable = self._cached, self._evictable
        for i in range(req.registered, end):
            block_hash = hashes[i]
            refs = cached.get(block_hash)
            if refs:  # a running request computed it too: this copy stays uncached (vLLM caches both)
                continue
            if refs == 0:  # an evictable copy: this one replaces it (in vLLM it outlives it)
                del evictable[block_hash]
            cached[block_hash] = 1
            req.held.append(block_hash)
        req.registered = max(end, req.registered)

    def take(self, count: int) -> None:
        """Allocate ``count`` free blocks: uncached ones first, then by evicting the least
        recently freed cached blocks (vLLM's free queue holds uncached blocks at its head)."""
        self.free_blocks -= count
        evictable = self._evictable
        if len(evictable) > self.free_blocks:
            cached = self._cached
            for _ in range(len(evictable) - self.free_blocks):
                del cached[evictable.popitem(last=False)[0]]

    def release(self, req: BlockOwner) -> None:
        """Free a request's blocks; its cached ones no other request uses become evictable,
        tail block first (vLLM frees a request's blocks in reverse, so its tail is evicted first)."""
        held = req.held
        if held:
            freed = req.blocks - len(held)
            cached, evictable = self._cached, self._evictable
            for block_hash in reversed(held):
                refs = cached[block_hash] - 1
                cached[block_hash] = refs
                if not refs:
                    evictable[block_hash] = None
                    freed += 1
            held.clear()
            self.free_blocks += freed
        else:
            self.free_blocks += req.blocks
        req.blocks = 0
        req.registered = 0
