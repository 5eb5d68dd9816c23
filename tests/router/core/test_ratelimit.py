"""Token buckets per adapter: burst, steady rate, token limits settled by real usage, headers,
and the pool-wide share measured with three routers."""

from __future__ import annotations

import pytest

from lorapool.api.traffic import AdapterTraffic, RateLimits, TrafficPolicy
from lorapool.router.core.ratelimit import Allow, RateLimiter, Throttle, duration


def limiter(routers: int = 1, **limits: float) -> RateLimiter:
    rl = RateLimiter()
    policy = TrafficPolicy(routers=routers, adapters={"sql": AdapterTraffic(limits=RateLimits(**limits))})
    rl.configure(policy, now_s=0.0)
    return rl


def admitted(rl: RateLimiter, times: list[float], tokens: int = 0) -> int:
    return sum(isinstance(rl.check("sql", tokens, t), Allow) for t in times)


def test_an_adapter_without_limits_is_never_throttled_and_gets_no_headers() -> None:
    rl = limiter(requests_per_second=1)
    verdicts = [rl.check("chat", 10**6, 0.0) for _ in range(1000)]
    assert all(isinstance(v, Allow) and v.headers == () and not v.metered for v in verdicts)


def test_a_burst_passes_at_once_then_the_sustained_rate_holds() -> None:
    rl = limiter(requests_per_second=2, burst_requests=5)
    assert admitted(rl, [0.0] * 10) == 5  # the burst, at one instant
    # then 2 per second: 20 over the next 10 s, requests arriving every 10 ms
    assert admitted(rl, [0.01 * i for i in range(1, 1001)]) == 20


def test_the_default_burst_is_one_seconds_worth() -> None:
    assert admitted(limiter(requests_per_second=3), [0.0] * 10) == 3
    assert admitted(limiter(requests_per_second=0.2), [0.0] * 10) == 1  # at least one request


def test_a_throttle_says_when_to_come_back_and_which_limit() -> None:
    rl = limiter(requests_per_second=0.5, burst_requests=1)
    assert isinstance(rl.check("sql", 0, 0.0), Allow)
    throttle = rl.check("sql", 0, 0.1)
    assert isinstance(throttle, Throttle)
    assert throttle.status == 429 and throttle.limited_by == "requests"
    assert throttle.retry_after_s == 2  # 1.9 s until the next request, rounded up
    headers = dict(throttle.all_headers())
    assert headers["Retry-After"] == "2"
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1.9s"
    assert "'sql'" in throttle.message and "0.5 requests per second" in throttle.message
    assert isinstance(rl.check("sql", 0, 2.0), Allow)  # and it was right


def test_token_limits_charge_the_prompt_and_settle_the_real_usage() -> None:
    rl = limiter(tokens_per_minute=6000)  # 100 tokens a second, a burst of 6000
    first = rl.check("sql", 1000, 0.0)
    assert isinstance(first, Allow) and first.charged == 1000 and first.metered
    assert dict(first.headers)["x-ratelimit-remaining-tokens"] == "5000"
    rl.settle("sql", first.charged, used=5500, now_s=0.0)  # a long answer: 4500 more
    throttle = rl.check("sql", 1000, 0.0)  # 500 left, 1000 asked
    assert isinstance(throttle, Throttle) and throttle.limited_by == "tokens"
    assert throttle.retry_after_s == 5  # 500 tokens at 100 a second
    assert isinstance(rl.check("sql", 1000, 5.0), Allow)


def test_an_estimate_that_was_too_high_is_refunded() -> None:
    rl = limiter(tokens_per_minute=600, burst_tokens=100)
    allow = rl.check("sql", 100, 0.0)
    assert isinstance(allow, Allow)
    assert isinstance(rl.check("sql", 50, 0.0), Throttle)
    rl.settle("sql", allow.charged, used=40, now_s=0.0)  # 60 back
    assert isinstance(rl.check("sql", 50, 0.0), Allow)


def test_a_prompt_longer_than_the_burst_passes_once_the_bucket_is_full() -> None:
    rl = limiter(tokens_per_minute=600, burst_tokens=100)
    assert isinstance(rl.check("sql", 10**6, 0.0), Allow)  # charged the whole bucket, not refused forever
    assert isinstance(rl.check("sql", 1, 0.0), Throttle)


def test_debt_is_bounded_by_one_burst() -> None:
    rl = limiter(tokens_per_minute=600, burst_tokens=100)  # 10 tokens a second
    allow = rl.check("sql", 10, 0.0)
    assert isinstance(allow, Allow)
    rl.settle("sql", allow.charged, used=10**9, now_s=0.0)
    throttle = rl.check("sql", 10, 0.0)
    assert isinstance(throttle, Throttle) and throttle.retry_after_s == 11  # -100 -> +10 at 10/s, not 10**8 s


def test_both_limits_apply_and_the_longer_wait_answers() -> None:
    rl = limiter(requests_per_second=1, tokens_per_minute=60)  # 1 token a second
    assert isinstance(rl.check("sql", 60, 0.0), Allow)
    throttle = rl.check("sql", 30, 1.0)  # a request is back, 30 tokens are 29 s away
    assert isinstance(throttle, Throttle) and throttle.limited_by == "tokens" and throttle.retry_after_s == 29
    headers = dict(throttle.headers)
    assert {"x-ratelimit-limit-requests", "x-ratelimit-limit-tokens"} <= headers.keys()


def test_a_reread_policy_keeps_the_buckets_and_a_changed_limit_starts_afresh() -> None:
    rl = limiter(requests_per_second=1)
    assert isinstance(rl.check("sql", 0, 0.0), Allow)
    same = TrafficPolicy(adapters={"sql": AdapterTraffic(limits=RateLimits(requests_per_second=1))})
    rl.configure(same, now_s=0.0)
    assert isinstance(rl.check("sql", 0, 0.0), Throttle)  # no fresh burst from re-reading the file
    changed = TrafficPolicy(adapters={"sql": AdapterTraffic(limits=RateLimits(requests_per_second=2))})
    rl.configure(changed, now_s=0.0)
    assert admitted(rl, [0.0] * 5) == 2
    rl.configure(TrafficPolicy(), now_s=0.0)
    assert admitted(rl, [0.0] * 5) == 5  # limits removed


def routers(n: int, **limits: float) -> list[RateLimiter]:
    return [limiter(routers=n, **limits) for _ in range(n)]


@pytest.mark.parametrize("rate", [3.0, 10.0, 50.0])
def test_three_routers_spread_evenly_admit_the_pool_limit_and_never_more(rate: float) -> None:
    """Over-admission with three routers, measured: a client sending 4x the limit for 30 s through
    a Service that spreads requests over the routers (round-robin here) gets the limit, and the
    burst at most above it (the shares sum to the limit)."""
    pool = routers(3, requests_per_second=rate)
    arrivals = [i / (4 * rate) for i in range(int(4 * rate * 30))]
    passed = sum(isinstance(pool[i % 3].check("sql", 0, t), Allow) for i, t in enumerate(arrivals))
    allowed = rate * 30 + rate  # the sustained rate over 30 s plus one pool burst (1 s worth)
    assert passed <= allowed + 1e-9
    assert passed >= 0.95 * rate * 30  # and it is not starved either


def test_three_routers_with_all_traffic_on_one_admit_its_share() -> None:
    """The share's cost, measured: a client whose requests all reach one router (one keep-alive
    connection) gets a third of the limit (core.ratelimit's docstring says so)."""
    pool = routers(3, requests_per_second=30)
    arrivals = [i / 120 for i in range(120 * 30)]
    passed = sum(isinstance(pool[0].check("sql", 0, t), Allow) for t in arrivals)
    assert 10 * 30 <= passed <= 10 * 31


def test_a_request_burst_below_one_per_router_rounds_up_to_one() -> None:
    pool = routers(3, requests_per_second=1, burst_requests=1)
    assert sum(isinstance(r.check("sql", 0, 0.0), Allow) for r in pool) == 3  # routers - 1 over, at most


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.0, "0ms"), (0.02, "20ms"), (1.5, "1.5s"), (360, "6m0s"), (61.2, "1m2s")]
)
def test_reset_times_read_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
