"""Sizing, pure: the concurrency estimate behind auto --max-loras, and the recommendation from
the engines' observations (tables), plus the planner using both."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lorapool.api.report import Observations
from lorapool.plan.planner import plan_pool
from lorapool.plan.sizing import (
    MIN_SAMPLES,
    Action,
    Evidence,
    SlotBounds,
    estimate_concurrency,
    expected_distinct,
    pool_evidence,
    recommend,
)
from tests.plan.test_planner import pool, ranks


@pytest.mark.parametrize(
    ("n", "sequences", "want"),
    [(1, 100, 1.0), (32, 256, 32.0), (320, 256, 176.0), (1000, 10, 9.95), (0, 10, 0.0), (10, 0, 0.0)],
    ids=["one-adapter", "few-adapters-all-busy", "many-adapters-half-busy", "sparse", "no-adapters", "no-sequences"],
)
def test_expected_distinct_adapters_of_uniform_traffic(n: int, sequences: int, want: float) -> None:
    assert expected_distinct(n, sequences) == pytest.approx(want, abs=0.6)


ESTIMATES = {
    # name: (adapters, kv tokens, maxNumSeqs, maxModelLen) -> (sequences, distinct)
    "kv-bound": ((320, 200 * 2048, 256, 8192), (200, 149)),
    "max-num-seqs-bound": ((320, 10**7, 64, 8192), (64, 59)),
    "short-context-counts-whole-sequences": ((50, 100 * 512, 256, 512), (100, 44)),
    "fewer-adapters-than-sequences": ((8, 10**6, 256, 8192), (256, 8)),
    "kv-for-less-than-one-sequence": ((5, 100, 256, 8192), (1, 1)),
}


@pytest.mark.parametrize(("args", "want"), ESTIMATES.values(), ids=ESTIMATES.keys())
def test_estimate_concurrency(args: tuple[int, int, int, int], want: tuple[int, int]) -> None:
    n, kv, seqs, length = args
    c = estimate_concurrency(n, kv_tokens=kv, max_num_seqs=seqs, max_model_len=length)
    assert (c.sequences, c.distinct) == want
    assert "concurrency" in c.describe() and str(c.distinct) in c.describe()


def test_auto_sizes_a_large_catalog_by_concurrency_not_by_catalog_size() -> None:
    """Issue 15: 320 rank-16 adapters used to get 256 slots (maxNumSeqs); the estimate gives fewer
    and more KV cache, and says so; small pools keep a slot per adapter (issue 11's invariants)."""
    big = plan_pool(pool().spec, ranks(*[16] * 320))
    assert big.concurrency is not None and big.max_loras == big.concurrency.distinct < 256
    assert "concurrency estimate" in big.reasons["maxLoras"] and "320 adapters" in big.reasons["maxLoras"]
    capped = plan_pool(pool(lora={"maxLoras": 256}).spec, ranks(*[16] * 320))
    assert big.memory.kv_cache_tokens > capped.memory.kv_cache_tokens * 1.3
    small = plan_pool(pool().spec, ranks(*[16] * 32))
    assert small.max_loras == 32 and "concurrency" not in small.reasons["maxLoras"]


def test_a_fixed_point_holds_the_batch_the_slots_leave_room_for() -> None:
    plan = plan_pool(pool().spec, ranks(*[16] * 320))
    c = plan.concurrency
    assert c is not None
    assert c.sequences == min(256, plan.memory.kv_cache_tokens // c.sequence_tokens)


def test_plan_output_shows_the_concurrency_estimate() -> None:
    from lorapool.commands.explain import explain_plan

    p = pool()
    plan = plan_pool(p.spec, ranks(*[16] * 320))
    text = explain_plan(p, plan, 320)
    assert "concurrency" in text and f"use {plan.concurrency.distinct if plan.concurrency else -1} distinct" in text


def test_tuned_slots_are_applied_only_when_tuning_applies_and_within_bounds() -> None:
    adapters = ranks(*[16] * 320)
    on = pool(lora={"tuning": {"apply": True}}).spec
    assert plan_pool(on, adapters, tuned=40).max_loras == 40
    assert "sizing loop" in plan_pool(on, adapters, tuned=40).reasons["maxLoras"]
    assert plan_pool(on, adapters, tuned=100_000).max_loras == 256  # maxNumSeqs still caps it
    off = pool(lora={"tuning": {"apply": False}}).spec
    assert plan_pool(off, adapters, tuned=40).max_loras == plan_pool(off, adapters).max_loras


def test_tuning_apply_with_an_explicit_max_loras_is_refused_naming_both() -> None:
    from lorapool.api.load import parse_object
    from lorapool.errors import LoRAPoolError

    body: dict[str, Any] = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "baseModel": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": "hf://x/y"},
            "gpu": {"product": "A100-80GB"},
            "lora": {"maxLoras": 8, "tuning": {"apply": True}},
        },
    }
    with pytest.raises(LoRAPoolError, match=r"tuning.apply needs maxLoras 'auto'"):
        parse_object(body)


def obs(**kw: Any) -> Observations:
    base = Observations(
        window_s=60.0,
        end=1000.0,
        samples=30,
        max_loras=128,
        distinct_p50=4.0,
        distinct_p95=8.0,
        distinct_max=10,
        slot_wait_s=0.0,
        kv_wait_s=0.0,
        kv_usage_p50=0.2,
        kv_usage_p95=0.4,
        kv_usage_max=0.5,
        running_p95=40.0,
        waiting_p95=0.0,
        preemptions=0,
        finished=600,
        ttft_p50_s=0.05,
        ttft_p99_s=0.5,
    )
    return replace(base, **kw)


def test_pool_evidence_takes_the_worst_replica_and_sums_counts() -> None:
    e = pool_evidence([obs(), obs(distinct_p95=20.0, ttft_p99_s=2.0, slot_wait_s=6.0, end=1010.0)])
    assert e is not None
    assert (e.replicas, e.samples, e.distinct_p95, e.ttft_p99_s, e.slot_wait_s, e.end) == (
        2,
        60,
        20.0,
        2.0,
        6.0,
        1010.0,
    )
    assert e.goodput == pytest.approx(20.0) and e.slot_wait_share == pytest.approx(0.05)
    assert pool_evidence([]) is None


BOUNDS = SlotBounds(current=128, max_slots=256, n_adapters=320, slot_bytes=92_356_608, kv_per_token_bytes=131_072)

RECOMMEND: dict[str, tuple[Evidence | None, SlotBounds, int, Action]] = {
    "no-reports-yet": (None, BOUNDS, 128, Action.INSUFFICIENT),
    "too-few-samples": (pool_evidence([obs(samples=MIN_SAMPLES - 1)]), BOUNDS, 128, Action.INSUFFICIENT),
    "zipf-few-hot-shrinks-to-p95-plus-margin": (pool_evidence([obs()]), BOUNDS, 10, Action.SHRINK),
    "uniform-busy-grows": (pool_evidence([obs(distinct_p95=180.0, distinct_max=200)]), BOUNDS, 225, Action.GROW),
    "capped-by-the-kv-floor": (
        pool_evidence([obs(distinct_p95=180.0)]),
        replace(BOUNDS, max_slots=150),
        150,
        Action.GROW,
    ),
    "capped-by-the-adapter-count": (
        pool_evidence([obs(distinct_p95=30.0)]),
        replace(BOUNDS, n_adapters=20, current=8),
        20,
        Action.GROW,
    ),
    "slot-waits-with-every-slot-busy-grow-past-the-censored-count": (
        pool_evidence([obs(distinct_p50=8.0, distinct_p95=8.0, distinct_max=8, slot_wait_s=6.0)]),
        replace(BOUNDS, current=8),
        10,
        Action.GROW,
    ),
    "slot-waits-grow-even-one-slot": (
        pool_evidence([obs(distinct_p50=1.0, distinct_p95=1.0, distinct_max=1, slot_wait_s=6.0)]),
        replace(BOUNDS, current=1, n_adapters=3),
        2,
        Action.GROW,
    ),
    "slot-waits-with-demand-shown-raise-it-to-the-max": (
        pool_evidence([obs(distinct_p95=8.0, distinct_max=30, slot_wait_s=6.0)]),
        replace(BOUNDS, current=8),
        30,
        Action.GROW,
    ),
    "kv-short-steps-down-instead-of-growing": (
        pool_evidence([obs(distinct_p95=180.0, preemptions=3)]),
        BOUNDS,
        108,
        Action.SHRINK,
    ),
    "kv-short-still-shrinks": (pool_evidence([obs(kv_wait_s=6.0)]), BOUNDS, 10, Action.SHRINK),
    "within-the-band-keeps": (pool_evidence([obs(distinct_p95=100.0)]), BOUNDS, 128, Action.KEEP),
    "small-moves-keep-small-pools": (
        pool_evidence([obs(distinct_p95=7.0)]),
        replace(BOUNDS, current=8),
        8,
        Action.KEEP,
    ),
}


@pytest.mark.parametrize(("evidence", "bounds", "want", "action"), RECOMMEND.values(), ids=RECOMMEND.keys())
def test_recommend(evidence: Evidence | None, bounds: SlotBounds, want: int, action: Action) -> None:
    r = recommend(evidence, bounds)
    assert (r.max_loras, r.action) == (want, action), r.evidence
    assert r.kv_bytes == (bounds.current - want) * bounds.slot_bytes
    assert r.kv_tokens == r.kv_bytes // bounds.kv_per_token_bytes
    if action in (Action.GROW, Action.SHRINK):
        assert ("frees" if want < bounds.current else "costs") in r.evidence
        assert "p95" in r.evidence and f"{r.window_s:.0f} s" in r.evidence


def test_a_shrink_says_what_it_frees_in_words() -> None:
    r = recommend(pool_evidence([obs()]), BOUNDS)
    assert "shrink to 10" in r.evidence and "frees 10.9 GB = 83,145 KV tokens per GPU" in r.evidence, r.evidence


def test_the_docs_example_is_what_recommend_writes() -> None:
    """docs/sizing.md shows a recommendation as kubectl describe prints it; it must be the real output."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "sizing.md").read_text()
    block = text[text.index("    Recommendation:") :].split("\n\n")[0]
    evidence = " ".join(line.split("Evidence:")[-1].strip() for line in block.splitlines()[3:7] if line.strip())
    o = obs(window_s=60.0, samples=30, max_loras=134, distinct_p50=14.0, distinct_p95=31.0, distinct_max=38)
    o = replace(o, kv_usage_p95=0.91)
    r = recommend(pool_evidence([o, o]), replace(BOUNDS, current=134))
    assert evidence == r.evidence
    assert f"Kv Cache Tokens:  {r.kv_tokens}" in block and f"Max Loras:        {r.max_loras}" in block
