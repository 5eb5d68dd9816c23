"""The scheduler and the prefix scorer: each request's prompt hashed once, only with --prefix-weight,
and a bind recording its blocks on the backend it went to, through the scorer's hooks, which the
scheduler calls without knowing the scorer (the scorer itself: tests/router/core)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.cli import configure, settings_from
from lorapool.router.core import registry
from lorapool.router.core.backend import Request
from lorapool.router.core.scorers.prefix import NAME, PREFIX_WEIGHT, PrefixScorer, block_hashes
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

PROMPT = "system\nYou answer questions about the orders database.\n" * 10


def pool(prefix_weight: float, backends: tuple[str, ...] = ("http://a", "http://b")) -> Scheduler:
    settings = RouterSettings(prefix_weight=prefix_weight, max_loras=2)
    scheduler = Scheduler(registry.build("affinity", settings.policy_params()), settings, Telemetry())
    scheduler.set_backends(backends)
    cards = [{"id": "base"}, {"id": "sql", "parent": "base"}]
    for state in scheduler.backends():
        scheduler.polled(state, VllmMetrics(), cards)
    return scheduler


def blocks(req: Request) -> tuple[int, ...]:
    kept = req.prepared.get(NAME, ())
    assert isinstance(kept, tuple)
    return kept


def scorer_of(scheduler: Scheduler) -> PrefixScorer:
    (scorer,) = scheduler.scheduling.hooked
    assert isinstance(scorer, PrefixScorer)
    return scorer


def test_the_prompt_is_hashed_only_with_the_prefix_weight() -> None:
    assert blocks(pool(0.0).request_for("sql", prompt=PROMPT)) == ()
    req = pool(PREFIX_WEIGHT).request_for("sql", prompt=PROMPT)
    assert blocks(req) == block_hashes("sql", PROMPT) and len(blocks(req)) == len(PROMPT) // 64
    assert blocks(pool(PREFIX_WEIGHT).request_for("sql")) == ()  # no body text (a header-only pick)


def test_a_bind_records_the_blocks_where_it_went_and_a_backend_that_leaves_takes_them() -> None:
    async def scenario() -> None:
        scheduler = pool(PREFIX_WEIGHT)
        req = scheduler.request_for("sql", prompt=PROMPT)
        lease = await scheduler.acquire(req)
        scheduler.release(lease)
        index = scorer_of(scheduler).indexes
        assert all(h in index[lease.backend] for h in blocks(req))
        other = next(s.id for s in scheduler.backends() if s.id != lease.backend)
        assert other not in index
        # The backend leaves, then comes back: an empty index.
        scheduler.set_backends([other])
        scheduler.set_backends([other, lease.backend])
        assert lease.backend not in index
        # A bind there again, then it goes down: its engine may come back a new one, its cache empty.
        again = await scheduler.acquire(req)
        scheduler.release(again)
        assert again.backend in index
        back = scheduler.backend(again.backend)
        assert back is not None
        scheduler.mark_down(back, "connect")
        assert again.backend not in index

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--prefix-weight", "-1"], "--prefix-weight must be a finite weight >= 0"),
        (["--prefix-weight", "nan"], "--prefix-weight must be a finite weight >= 0"),
        (["--prefix-weight", "inf"], "--prefix-weight must be a finite weight >= 0"),
        (["--prefix-weight", "--policy", "least-loaded"], "--prefix-weight applies to --policy affinity"),
    ],
    ids=["negative", "nan", "infinite", "another policy"],
)
def test_a_bad_prefix_weight_says_why(flags: list[str], error: str) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    with pytest.raises(ValueError, match=error):
        settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1", *flags]))


@pytest.mark.parametrize(
    ("flags", "weight"),
    [
        ([], 0.0),
        (["--prefix-weight"], PREFIX_WEIGHT),
        (["--prefix-weight", "1.2"], 1.2),
        (["--prefix-weight", "0"], 0.0),
    ],
    ids=["off by default", "the flag alone", "a weight", "zero: off"],
)
def test_the_prefix_weight_reaches_the_policy(flags: list[str], weight: float) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1", *flags]))
    assert settings.prefix_weight == weight == settings.policy_params().prefix_weight
