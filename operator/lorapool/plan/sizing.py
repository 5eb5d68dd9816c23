"""How many GPU slots (--max-loras) a pool needs: estimated before traffic, observed after it. Pure.

Called by the planner (``estimate_concurrency``: the static ``auto`` value), by the operator's
sizing step (``pool_evidence`` + ``recommend``: ``status.recommendation``) and by the benchmark.

A slot is worth having only while a batch holds that many distinct adapters: vLLM admits a
waiting request only if its adapter is running or fewer than max-loras adapters are, and every
slot's LoRA buffer is taken from the KV cache before it is sized. So:

- before traffic, the most distinct adapters a full batch can hold is the expected number of
  distinct adapters among the sequences the KV cache (and maxNumSeqs) lets run at once, with
  every adapter equally likely. Uniform traffic maximises that expectation for a given batch,
  so the estimate is safe for any traffic mix; skewed (Zipf) traffic needs fewer, which only
  observation can tell;
- after traffic, the distinct adapters the engines list (p95 over a window, with a margin:
  vLLM 0.32 lists the running batch's, so the count is censored at the slot count), grown past
  the current value when requests waited with every slot busy while KV cache was free; while the KV cache
  runs short (preemptions, waits with it full) never grown, but stepped down: a slot is paid for
  in KV cache, and the apply loop's rollback undoes a step that made latency worse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from lorapool.api.report import Observations

TYPICAL_SEQUENCE_TOKENS = 2048  # prompt + output of a typical in-flight request (capped at maxModelLen)
SLOT_MARGIN = 0.25  # recommended slots = observed p95 distinct adapters x (1 + this), rounded up
MIN_SAMPLES = 20  # fewer scrapes over all replicas than this: no recommendation
SLOT_WAIT_SIGNIFICANT = 0.02  # slot waits over this share of the window: grow to cover the max
KV_SHORT_SHRINK = 0.15  # while the KV cache runs short, step down by this much (the rollback guards it)
KEEP_BAND = 0.10  # a recommendation within this fraction (or 2 slots) of the current value keeps it


@dataclass(frozen=True)
class Concurrency:
    """The static estimate behind ``auto``: sequences a full batch holds and their distinct adapters."""

    sequences: int  # min(maxNumSeqs, KV tokens / tokens per sequence)
    sequence_tokens: int  # tokens per in-flight sequence assumed
    distinct: int  # expected distinct adapters among them (uniform traffic), rounded up
    n_adapters: int

    def describe(self) -> str:
        """One phrase for the plan's reason."""
        return (
            f"concurrency estimate: a full batch holds {self.sequences} sequences "
            f"(min of maxNumSeqs and KV cache / {self.sequence_tokens} tokens) which, spread evenly over "
            f"{self.n_adapters} adapters, use {self.distinct} distinct adapters"
        )


def expected_distinct(n_adapters: int, sequences: int) -> float:
    """E[distinct adapters] among ``sequences`` requests drawn uniformly from ``n_adapters``."""
    if n_adapters <= 0 or sequences <= 0:
        return 0.0
    return n_adapters * -math.expm1(sequences * math.log1p(-1.0 / n_adapters)) if n_adapters > 1 else 1.0


def estimate_concurrency(n_adapters: int, *, kv_tokens: int, max_num_seqs: int, max_model_len: int) -> Concurrency:
    """How many distinct adapters a full batch holds, before any traffic is seen."""
    seq_tokens = max(1, min(TYPICAL_SEQUENCE_TOKENS, max_model_len))
    sequences = max(1, min(max_num_seqs, kv_tokens // seq_tokens))
    # ceil, but a hair below an integer (float noise of n(1-(1-1/n)^s) when s >> n) is that integer
    distinct = min(n_adapters, math.ceil(expected_distinct(n_adapters, sequences) - 1e-6)) if n_adapters else 0
    return Concurrency(sequences, seq_tokens, max(distinct, 0), n_adapters)


@dataclass(frozen=True)
class Evidence:
    """The replicas' last windows, pooled: the worst replica for demand and latency, sums for counts."""

    replicas: int
    samples: int
    window_s: float
    end: float  # Unix time the newest window closed
    distinct_p50: float
    distinct_p95: float
    distinct_max: int
    slot_wait_s: float
    kv_wait_s: float
    kv_usage_p95: float
    preemptions: int
    finished: int
    goodput: float  # requests/s, summed over replicas
    ttft_p99_s: float | None  # the worst replica's
    engine_max_loras: int | None  # what the engines run with now (their max_lora label)

    @property
    def slot_wait_share(self) -> float:
        """Slot-wait seconds per replica-second of the window."""
        return self.slot_wait_s / (self.window_s * self.replicas) if self.window_s > 0 and self.replicas else 0.0

    @property
    def kv_short(self) -> bool:
        """The KV cache ran out (preemptions, or requests waited with it full): more slots would make it worse."""
        kv_share = self.kv_wait_s / (self.window_s * self.replicas) if self.window_s > 0 and self.replicas else 0.0
        return self.preemptions > 0 or kv_share >= SLOT_WAIT_SIGNIFICANT


def pool_evidence(observations: Sequence[Observations]) -> Evidence | None:
    """Pool the replicas' windows; None when there are none."""
    if not observations:
        return None
    ttfts = [o.ttft_p99_s for o in observations if o.ttft_p99_s is not None]
    engines = [o.max_loras for o in observations if o.max_loras is not None]
    return Evidence(
        replicas=len(observations),
        samples=sum(o.samples for o in observations),
        window_s=max(o.window_s for o in observations),
        end=max(o.end for o in observations),
        distinct_p50=max(o.distinct_p50 for o in observations),
        distinct_p95=max(o.distinct_p95 for o in observations),
        distinct_max=max(o.distinct_max for o in observations),
        slot_wait_s=sum(o.slot_wait_s for o in observations),
        kv_wait_s=sum(o.kv_wait_s for o in observations),
        kv_usage_p95=max(o.kv_usage_p95 for o in observations),
        preemptions=sum(o.preemptions for o in observations),
        finished=sum(o.finished for o in observations),
        goodput=sum(o.goodput for o in observations),
        ttft_p99_s=max(ttfts) if ttfts else None,
        engine_max_loras=max(engines) if engines else None,
    )


@dataclass(frozen=True)
class SlotBounds:
    """What a recommendation may choose from, from the plan: 1..max_slots, and each slot's price."""

    current: int  # the plan's --max-loras now
    max_slots: int  # the most the KV-cache floor and maxNumSeqs allow
    n_adapters: int
    slot_bytes: int  # one slot's LoRA buffers on one GPU, at the plan's rank
    kv_per_token_bytes: int


class Action(StrEnum):
    KEEP = "Keep"
    GROW = "Grow"
    SHRINK = "Shrink"
    INSUFFICIENT = "InsufficientData"


@dataclass(frozen=True)
class Recommendation:
    """A --max-loras the observations support, what it frees or costs, and why."""

    max_loras: int
    current: int
    action: Action
    kv_bytes: int  # KV cache per GPU freed by the change (negative: taken)
    kv_tokens: int
    evidence: str
    replicas: int = 0
    samples: int = 0
    window_s: float = 0.0
    end: float | None = None


def _slots_needed(e: Evidence, current: int) -> tuple[int, str]:
    """Slots the evidence asks for, and the arithmetic in words.

    vLLM 0.32 lists only the running batch's adapters, so the distinct count is censored at the
    slot count; when requests waited with every slot busy and KV cache free, demand is past what
    shows, and the need is at least the current value plus the margin (the loop's step bound and
    rollback guard the growth).
    """
    need = max(1, math.ceil(e.distinct_p95 * (1 + SLOT_MARGIN) - 1e-9))
    why = f"p95 {e.distinct_p95:g} x {1 + SLOT_MARGIN:g} margin = {need}"
    if e.slot_wait_share >= SLOT_WAIT_SIGNIFICANT:
        grown = max(e.distinct_max, current + 1, math.ceil(current * (1 + SLOT_MARGIN) - 1e-9))
        if grown > need:
            need = grown
            why += (
                f"; raised to {grown} because requests waited with every slot busy and KV cache free "
                f"{e.slot_wait_share:.0%} of the time"
            )
    return need, why


def recommend(e: Evidence | None, b: SlotBounds) -> Recommendation:
    """The --max-loras the evidence supports, within ``b``; ``current`` while the evidence is thin."""
    if e is None or e.samples < MIN_SAMPLES:
        seen = "no observations in the sidecars' reports yet" if e is None else f"only {e.samples} samples"
        return Recommendation(
            b.current, b.current, Action.INSUFFICIENT, 0, 0, f"{seen} (need {MIN_SAMPLES}); keeping {b.current}"
        )
    need, why = _slots_needed(e, b.current)
    ceiling = min(b.max_slots, max(1, b.n_adapters))
    target = min(need, ceiling)
    if target < need:
        why += f", capped at {ceiling} (" + ("the adapter count" if ceiling == b.n_adapters else "KV-cache floor") + ")"
    if e.kv_short and target > b.current * (1 - KV_SHORT_SHRINK):
        target = max(1, math.floor(b.current * (1 - KV_SHORT_SHRINK)))
        why += (
            f"; shrinking by {KV_SHORT_SHRINK:.0%} instead: the KV cache ran short ({e.preemptions} preemption(s), "
            f"{e.kv_wait_s:.0f} s of waits with it full) and every slot is paid for in KV cache"
        )
    band = max(2, math.ceil(KEEP_BAND * b.current))
    slots_short = target > b.current and e.slot_wait_share >= SLOT_WAIT_SIGNIFICANT
    if abs(target - b.current) < band and not slots_short:  # slot waits are a signal, not noise
        action, target = Action.KEEP, b.current
    else:
        action = Action.GROW if target > b.current else Action.SHRINK
    kv_bytes = (b.current - target) * b.slot_bytes
    kv_tokens = kv_bytes // b.kv_per_token_bytes if b.kv_per_token_bytes else 0
    seen = (
        f"over {e.window_s:.0f} s on {e.replicas} replica(s), {e.samples} samples: distinct adapters per batch "
        f"p50 {e.distinct_p50:g}, p95 {e.distinct_p95:g}, max {e.distinct_max} with {b.current} slots; "
        f"slot waits with KV free {e.slot_wait_s:.0f} s, KV usage p95 {e.kv_usage_p95:.0%}, "
        f"{e.preemptions} preemption(s)"
    )
    if action == Action.KEEP:
        verdict = f"keep {b.current} ({why}; within {band} of the current value)"
    else:
        price = (
            f"frees {kv_bytes / 1e9:.1f} GB = {kv_tokens:,} KV tokens per GPU"
            if kv_bytes > 0
            else f"costs {-kv_bytes / 1e9:.1f} GB = {-kv_tokens:,} KV tokens per GPU"
        )
        verdict = f"{action.value.lower()} to {target} ({why}); {price}"
    return Recommendation(
        target,
        b.current,
        action,
        kv_bytes if action != Action.KEEP else 0,
        kv_tokens if action != Action.KEEP else 0,
        f"{seen}: {verdict}",
        replicas=e.replicas,
        samples=e.samples,
        window_s=e.window_s,
        end=e.end,
    )
