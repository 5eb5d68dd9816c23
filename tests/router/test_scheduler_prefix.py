"""The scheduler and the prefix scorer: each request's prompt hashed once, only with --prefix-weight,
and a bind recording its blocks on the backend it went to (the scorer itself: tests/router/core)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.cli import configure, settings_from
from lorapool.router.core import registry
from lorapool.router.core.scorers.prefix import PREFIX_WEIGHT, block_hashes
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


def test_the_prompt_is_hashed_only_with_the_prefix_weight() -> None:
    assert pool(0.0).request_for("sql", prompt=PROMPT).prefix_blocks == ()
    req = pool(PREFIX_WEIGHT).request_for("sql", prompt=PROMPT)
    assert req.prefix_blocks == block_hashes("sql", PROMPT) and len(req.prefix_blocks) == len(PROMPT) // 64
    assert pool(PREFIX_WEIGHT).request_for("sql").prefix_blocks == ()  # no body text (a header-only pick)


def test_a_bind_records_the_blocks_where_it_went_and_a_backend_that_leaves_takes_them() -> None:
    async def scenario() -> None:
        scheduler = pool(PREFIX_WEIGHT)
        req = scheduler.request_for("sql", prompt=PROMPT)
        lease = await scheduler.acquire(req)
        scheduler.release(lease)
        views = {s.id: s.view() for s in scheduler.backends()}
        assert all(h in views[lease.backend].recent_blocks for h in req.prefix_blocks)
        other = next(b for b in views if b != lease.backend)
        assert req.prefix_blocks[0] not in views[other].recent_blocks
        # The backend leaves, then comes back: a new state, an empty index.
        scheduler.set_backends([other])
        scheduler.set_backends([other, lease.backend])
        back = scheduler.backend(lease.backend)
        assert back is not None and req.prefix_blocks[0] not in back.view().recent_blocks

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
