"""The simulated vLLM V1 engine: a pure, synchronous state machine stepped by the shell.

Pure: no clock, no I/O, no asyncio. ``server.py`` (the only caller in production) adds
requests, calls ``step()`` from one background task, sleeps ``duration_s x time_scale`` and
then hands the emitted tokens to the waiting HTTP handlers. ``run_workload`` drives the same
engine on a virtual clock for tests and offline experiments. This module is the scheduler and
the engine's public face; it keeps its caches in two siblings: ``lora_cache`` (GPU slots, CPU
cache, load prices; ``AdapterRef`` and ``LoadEvent`` are re-exported here) and ``kv_cache``
(KV blocks and the prefix cache).

What it reproduces from vLLM (``vllm/v1/core/sched/scheduler.py``, ``vllm/lora/``):

* continuous batching with chunked prefill under a token budget
  (``--max-num-batched-tokens``) and a sequence cap (``--max-num-seqs``); running requests are
  scheduled first, in admission order, then waiting requests first-come first-served;
* the max-loras admission rule: a waiting request whose adapter is not in this step's batch is
  skipped (it stays at the head of the queue, in order) once ``max_loras`` distinct adapters are
  scheduled, and later requests may overtake it;
* paged KV cache in blocks: a waiting request is admitted only if its blocks fit; a running
  request that cannot grow preempts the most recently admitted request, which recomputes later;
* GPU slots (``max_loras``) and a CPU cache (``max_cpu_loras``), both least-recently-used; a
  batch adapter missing from the slots is loaded inside the step and the whole batch waits for
  it (``lora_cache``, with vLLM 0.32's sticky ``load_inplace``);
* step time from ``TimingParams``: batch size, prefill tokens, distinct adapters, load stalls;
* automatic prefix caching (``--enable-prefix-caching``, on by default in V1; ``kv_cache`` says
  how, and where it is simpler than vLLM's): a waiting request's cached leading blocks are
  shared at admission and its prefill starts after them, so the step's prefill time covers only
  the uncached tokens; ``vllm:prefix_cache_queries``/``_hits`` count fresh admissions' tokens.

What it leaves out: speculative decoding, priorities, n > 1, beam search.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.peft import VLLM_RANKS
from lorapool.sim.kv_cache import KVCache
from lorapool.sim.lora_cache import AdapterRef as AdapterRef  # re-exported: part of the engine's vocabulary
from lorapool.sim.lora_cache import LoadEvent as LoadEvent
from lorapool.sim.lora_cache import LoraCache
from lorapool.sim.timing import TimingParams

WAITING, RUNNING, FINISHED = 0, 1, 2
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")


@dataclass(slots=True, eq=False)
class SimRequest:
    """One generation request. The shell fills the first block; the engine owns the rest."""

    request_id: str
    prompt_tokens: int
    output_tokens: int  # tokens to generate before finishing
    finish_reason: str = "length"  # reported when output_tokens are reached: "length" or "stop"
    adapter: AdapterRef | None = None
    handle: Any = None  # opaque to the engine: the shell's per-request waiter
    arrival_s: float = 0.0  # virtual clock, set by run_workload
    # Chained hashes of the prompt's full KV blocks, salted by the adapter (text.block_hashes); at
    # most prompt_tokens // block_size of them. Empty: nothing to look up or to cache.
    block_hashes: tuple[int, ...] = ()
    # engine-owned state
    state: int = WAITING
    prefill_len: int = 0  # tokens to prefill: the prompt, or prompt + output after a preemption
    computed: int = 0  # of prefill_len
    kv_tokens: int = 0
    blocks: int = 0
    generated: int = 0
    num_preemptions: int = 0
    first_token_s: float = -1.0
    finished_s: float = -1.0
    final_reason: str = ""
    cached_tokens: int = 0  # prefix-cache hit at its first admission (vLLM's num_cached_tokens)
    held: list[int] = field(default_factory=list)  # hashes of the cached blocks it references
    registered: int = 0  # leading block_hashes it has hit or computed


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one engine step did and how long it took (simulated seconds)."""

    duration_s: float
    forward_s: float
    stall_s: float
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    distinct_adapters: int
    loads: tuple[LoadEvent, ...]
    emitted: list[SimRequest]  # requests that produced one token in this step
    finished: list[SimRequest]
    preempted: int


@dataclass(frozen=True)
class EngineConfig:
    """vLLM's scheduler, cache and LoRA settings, with vLLM's startup checks."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # None: equal to max_loras, as in vLLM
    enable_prefix_caching: bool = True  # vLLM V1's default (CacheConfig.enable_prefix_caching)

    def __post_init__(self) -> None:
        if self.max_lora_rank not in VLLM_RANKS:
            raise ValueError(f"--max-lora-rank={self.max_lora_rank} is not one of vLLM's ranks {VLLM_RANKS}")
        if self.max_loras < 1:
            raise ValueError(f"--max-loras={self.max_loras} must be >= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"--max-cpu-loras={self.max_cpu_loras} must be >= --max-loras={self.max_loras} "
                "(vLLM refuses to start); raise --max-cpu-loras or lower --max-loras"
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("--max-num-seqs, --max-num-batched-tokens and --block-size must be >= 1")
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {self.num_gpu_blocks * self.block_size} tokens, fewer than "
                f"--max-model-len={self.max_model_len} (vLLM refuses to start); lower "
                "--max-model-len, --max-loras or --max-lora-rank, or raise "
                "--gpu-memory-utilization"
            )

    @property
    def cpu_capacity(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras


@dataclass
class EngineStats:
    """Monotonic counters the metrics endpoint exposes."""

    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    loads: dict[str, int] = field(default_factory=lambda: {"cpu": 0, "disk": 0})
    cold_loads: int = 0
    stall_s: float = 0.0
    busy_s: float = 0.0
    # vLLM's PrefixCacheStats of fresh admissions (a preempted request's re-admission is not counted)
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of those, tokens found cached
    prompt_tokens_cached: int = 0  # cached tokens of prompts that had their first token


@dataclass(slots=True)
class _Batch:
    """One step's batch while it is being scheduled."""

    budget: int  # tokens left under --max-num-batched-tokens
    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)  # request, tokens this step
    loras: dict[int, AdapterRef] = field(default_factory=dict)  # distinct adapters in the batch
    prefill_tokens: int = 0
    preempted: int = 0

    def add(self, req: SimRequest, n: int, *, prefill: bool) -> None:
        self.scheduled.append((req, n))
        self.budget -= n
        if prefill:
            self.prefill_tokens += n
        if req.adapter is not None:
            self.loras[req.adapter.lora_id] = req.adapter


class Engine:
    """The scheduler, KV cache and LoRA caches of one vLLM replica."""

    def __init__(self, config: EngineConfig, timing: TimingParams) -> None:
        self.config = config
        self.timing = timing
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.kv = KVCache(config.num_gpu_blocks, config.block_size, caching=config.enable_prefix_caching)
        self.clock_s = 0.0  # simulated seconds spent in steps and loads
        self.stats = EngineStats()
        self.loras = LoraCache(config.max_loras, config.cpu_capacity, timing)
        self._running_names: dict[str, int] = {}
        self._waiting_names: dict[str, int] = {}
        # vLLM's LoRARequestStates: requests per adapter from their first token to their end
        self._listed_names: dict[str, int] = {}

    # -- requests -------------------------------------------------------------------------

    def add_request(self, req: SimRequest) -> None:
        """Queue a request; the shell has already checked it fits max_model_len."""
        if len(req.block_hashes) > req.prompt_tokens // self.config.block_size:
            raise ValueError(
                f"request {req.request_id}: {len(req.block_hashes)} block hashes for {req.prompt_tokens} "
                f"prompt tokens; at most one per full block of {self.config.block_size} tokens"
            )
        req.state = WAITING
        req.prefill_len = req.prompt_tokens
        self.waiting.append(req)
        if req.adapter is not None:
            _inc(self._waiting_names, req.adapter.name)

    def abort(self, req: SimRequest) -> bool:
        """Drop a request the client gave up on; False when it had already finished."""
        if req.state == FINISHED:
            return False
        if req.state == RUNNING:
            self.running.remove(req)
            self.kv.release(req)
            if req.adapter is not None:
                _dec(self._running_names, req.adapter.name)
        else:
            self.waiting.remove(req)
            if req.adapter is not None:
                _dec(self._waiting_names, req.adapter.name)
        if req.adapter is not None and req.first_token_s >= 0:
            _dec(self._listed_names, req.adapter.name)
        req.state = FINISHED
        req.final_reason = "abort"
        req.finished_s = self.clock_s
        self.stats.finished["abort"] += 1
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def free_blocks(self) -> int:
        """Free KV blocks, evictable cached ones included."""
        return self.kv.free_blocks

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use, as vllm:kv_cache_usage_perc (1.0 = full)."""
        return self.kv.usage

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """Leading blocks of ``block_hashes`` the prefix cache holds (in use or evictable)."""
        return self.kv.cached_prefix_blocks(block_hashes)

    def evictable_blocks(self) -> tuple[int, ...]:
        """Hashes of cached blocks no request references, the next to be evicted first."""
        return self.kv.evictable_blocks()

    def running_adapter_names(self) -> tuple[str, ...]:
        return tuple(self._running_names)

    def waiting_adapter_names(self) -> tuple[str, ...]:
        return tuple(self._waiting_names)

    def listed_adapter_names(self) -> tuple[str, ...]:
        """What vLLM's ``lora_requests_info`` lists (both labels, 0.32 and 0.34): adapters with a
        request that has had its first token and not finished (a preempted one stays listed), in
        the order they were (re)listed. Requests that only wait, or sit in a prefill chunk, do not
        show: vLLM's serving layer learns of a request's scheduling with its first output."""
        return tuple(self._listed_names)

    def gpu_adapters(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return self.loras.gpu_adapters()

    def cpu_adapters(self) -> tuple[str, ...]:
        """Adapters in the CPU cache, least recently used first."""
        return self.loras.cpu_adapters()

    # -- adapters -------------------------------------------------------------------------

    def load_adapter(self, ref: AdapterRef, *, replace: bool = False) -> LoadEvent:
        """vLLM's add_lora utility call: read from disk into the CPU cache and a GPU slot.

        It runs between steps, so the shell must hold the next step back by ``seconds``.
        ``replace`` re-reads an adapter already cached under the same id (load_inplace).
        """
        in_use = {r.adapter.lora_id for r in self.running if r.adapter is not None}
        event = self.loras.load(ref, replace=replace, in_use=in_use)
        self._account_loads((event,) if event.seconds > 0 else ())
        self.clock_s += event.seconds
        return event

    # -- the step -------------------------------------------------------------------------

    def step(self) -> StepResult:
        """Schedule one batch, load its adapters, advance every scheduled request."""
        batch = _Batch(budget=self.config.max_num_batched_tokens)
        self._schedule_running(batch)
        self._schedule_waiting(batch)
        loads: tuple[LoadEvent, ...] = ()
        stall_s = 0.0
        if batch.loras:
            loads = self.loras.activate(batch.loras)
            stall_s = sum(event.seconds for event in loads)
            self._account_loads(loads)
        forward_s = self.timing.forward_s(len(batch.scheduled), batch.prefill_tokens, len(batch.loras))
        duration_s = forward_s + stall_s
        self.clock_s += duration_s
        emitted, finished = self._advance(batch.scheduled, now=self.clock_s)
        stats = self.stats
        stats.generation_tokens += len(emitted)
        stats.preemptions += batch.preempted
        if batch.scheduled:
            stats.steps += 1
            stats.busy_s += duration_s
        return StepResult(
            duration_s=duration_s,
            forward_s=forward_s,
            stall_s=stall_s,
            num_seqs=len(batch.scheduled),
            prefill_tokens=batch.prefill_tokens,
            decode_tokens=len(emitted),
            distinct_adapters=len(batch.loras),
            loads=loads,
            emitted=emitted,
            finished=finished,
            preempted=batch.preempted,
        )

    def _schedule_running(self, batch: _Batch) -> None:
        """Running requests first, in admission order; one that cannot grow preempts the newest."""
        block = self.config.block_size
        running = self.running
        i = 0
        while i < len(running) and batch.budget > 0:
            req = running[i]
            remaining = req.prefill_len - req.computed
            n = min(remaining, batch.budget) if remaining > 0 else 1
            need = -(-(req.kv_tokens + n) // block) - req.blocks
            self_preempted = False
            while need > self.kv.free_blocks:
                victim = running.pop()
                self._preempt(victim)
                batch.preempted += 1
                if victim is req:
                    self_preempted = True
                    break
            if self_preempted:
                break
            self.kv.take(need)
            req.blocks += need
            batch.add(req, n, prefill=remaining > 0)
            if self.kv.caching and req.registered < len(req.block_hashes):
                self.kv.register(req, req.computed + n)
            i += 1

    def _schedule_waiting(self, batch: _Batch) -> None:
        """Waiting requests first-come first-served, under the max-loras rule and the KV blocks free."""
        cfg = self.config
        waiting, running = self.waiting, self.running
        skipped: list[SimRequest] = []
        while waiting and batch.budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            adapter = req.adapter
            if adapter is not None and len(batch.loras) >= cfg.max_loras and adapter.lora_id not in batch.loras:
                skipped.append(waiting.popleft())  # vLLM: scheduling would exceed max_loras
                continue
            if not self._admit(req, batch):
                break
            waiting.popleft()
            req.state = RUNNING
            running.append(req)
            if adapter is not None:
                _dec(self._waiting_names, adapter.name)
                _inc(self._running_names, adapter.name)
        if skipped:
            waiting.extendleft(reversed(skipped))

    def _admit(self, req: SimRequest, batch: _Batch) -> bool:
        """Give a waiting request its cached prefix and the blocks of its first chunk, if they fit.

        A waiting request holds no blocks and has computed nothing (new, or preempted). As vLLM's
        ``allocate_slots``: the hit blocks are shared, not allocated, but an evictable one leaves
        the free queue, so it counts against the free blocks as a new one does."""
        kv = self.kv
        block = self.config.block_size
        hit, touched = kv.lookup(req)
        hit_tokens = hit * block
        n = min(req.prefill_len - hit_tokens, batch.budget)
        new = -(-(hit_tokens + n) // block) - hit
        if new + touched > kv.free_blocks:
            return False
        if kv.caching:
            kv.reference(req, hit)
            if req.num_preemptions == 0:  # vLLM counts re-admissions of preempted requests apart
                self.stats.prefix_cache_queries += req.prefill_len
                self.stats.prefix_cache_hits += hit_tokens
                req.cached_tokens = hit_tokens
        req.computed = req.kv_tokens = hit_tokens
        kv.take(new + touched)
        req.blocks = hit + new
        batch.add(req, n, prefill=True)
        if kv.caching and req.registered < len(req.block_hashes):
            kv.register(req, hit_tokens + n)
        return True

    def _advance(
        self, scheduled: list[tuple[SimRequest, int]], *, now: float
    ) -> tuple[list[SimRequest], list[SimRequest]]:
        """Credit each scheduled request its tokens; those that sample emit one, some finish."""
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        stats = self.stats
        for req, n in scheduled:
            req.kv_tokens += n
            if req.computed < req.prefill_len:
                req.computed += n
                if req.computed < req.prefill_len:
                    continue  # a prefill chunk that does not finish the prompt samples nothing
                if req.first_token_s < 0:
                    req.first_token_s = now
                    stats.prompt_tokens += req.prompt_tokens
                    stats.prompt_tokens_cached += req.cached_tokens
                    if req.adapter is not None:
                        _inc(self._listed_names, req.adapter.name)
            req.generated += 1
            emitted.append(req)
            if req.generated >= req.output_tokens:
                req.state = FINISHED
                req.final_reason = req.finish_reason
                req.finished_s = now
                self.kv.release(req)
                if req.adapter is not None:
                    _dec(self._running_names, req.adapter.name)
                    _dec(self._listed_names, req.adapter.name)
                stats.finished[req.finish_reason] += 1
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.state == RUNNING]
        return emitted, finished

    # -- internals ------------------------------------------------------------------------

    def _account_loads(self, loads: tuple[LoadEvent, ...]) -> None:
        for event in loads:
            self.stats.loads[event.source] += 1
            self.stats.cold_loads += event.cold
            self.stats.stall_s += event.seconds

    def _preempt(self, req: SimRequest) -> None:
        """vLLM V1 recompute preemption: free the blocks, requeue at the head of waiting."""
        self.kv.release(req)
        req.state = WAITING
        req.prefill_len = req.prompt_tokens + req.generated
        req.computed = 0
        req.kv_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        if req.adapter is not None:
            _dec(self._running_names, req.adapter.name)
            _inc(self._waiting_names, req.adapter.name)


def run_workload(engine: Engine, arrivals: Iterable[tuple[float, SimRequest]]) -> list[StepResult]:
    """Run requests arriving at virtual times to completion; return every step taken.

    Arrivals must be sorted by time. Idle gaps advance the clock to the next arrival. Each
    request ends with ``arrival_s``, ``first_token_s`` and ``finished_s`` on the same clock.
    """
    pending: Iterator[tuple[float, SimRequest]] = iter(arrivals)
    upcoming = next(pending, None)
    steps: list[StepResult] = []
    while upcoming is not None or engine.has_work:
        while upcoming is not None and upcoming[0] <= engine.clock_s:
            upcoming[1].arrival_s = upcoming[0]
            engine.add_request(upcoming[1])
            upcoming = next(pending, None)
        if not engine.has_work:
            assert upcoming is not None
            engine.clock_s = upcoming[0]
            continue
        result = engine.step()
        if result.num_seqs == 0:
            raise RuntimeError("engine made no progress with work queued")  # a scheduler bug
        steps.append(result)
    return steps


def _inc(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


def _dec(counts: dict[str, int], name: str) -> None:
    left = counts[name] - 1
    if left:
        counts[name] = left
    else:
        del counts[name]
