"""Per-adapter rate limits: token buckets, and the 429 and headers a client sees. Pure.

Each limited adapter (``api.traffic.RateLimits``) has up to two buckets: requests (refilled at
``requestsPerSecond``, holding ``burstRequests``) and tokens (refilled at ``tokensPerMinute``/60,
holding ``burstTokens``). A request passes when its request bucket holds one request and its
token bucket holds its prompt estimate (capped at the bucket's size, so a prompt longer than the
burst still passes once the bucket is full); both are charged at once. When the response ends,
``settle`` charges the tokens it really used (prompt + completion, from the engine's ``usage`` or
counted from the stream) less what was charged: a long answer leaves a debt later requests wait
out (at most one burst deep), an estimate that was too high is refunded.

The limits are the pool's, not one router's: each of the ``routers`` replicas (``TrafficPolicy.
routers``, the operator writes the router Deployment's replicas) enforces 1/routers of every
rate and burst. A share needs no channel between routers, so it is never stale, and it cannot
over-admit: the shares sum to the limit (a request burst below one request a router is rounded up
to one, so a burst may pass ``routers - 1`` requests over). Its cost is under-admission when a
client's traffic is not spread over the routers (a single keep-alive connection through the
Service lands on one router, which admits 1/routers of the limit): tests/router/test_ratelimit.py
measures both with three routers. With shared books (``--shared-state``, ``core.books``) and live
peers, a router's share is its share of the adapter's demand instead (``check``'s ``share``): a
client pinned to one router gets the whole limit there, and the shares still sum to one; when the
store is lost the share falls back to 1/routers, which cannot over-admit.

Throttled requests are refused before they are counted as demand (``RequestCounter``): placement
sizes an adapter's holders for the traffic the pool admits, so a flood over quota gets no replicas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from lorapool.api.traffic import RateLimits, TrafficPolicy

# A debt never grows beyond one burst: a single huge answer throttles for one refill, not for hours.
MAX_DEBT_BURSTS = 1.0


@dataclass(slots=True)
class Bucket:
    """A token bucket: ``level`` of ``size`` units, refilled at ``rate`` a second, up to ``size``."""

    rate: float
    size: float
    level: float
    at_s: float

    def fill(self, now_s: float) -> None:
        if now_s > self.at_s:
            self.level = min(self.size, self.level + (now_s - self.at_s) * self.rate)
            self.at_s = now_s

    def wait_s(self, amount: float) -> float:
        """Seconds until the bucket holds ``amount`` (0: it does)."""
        return max(0.0, (amount - self.level) / self.rate)

    def full_in_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-*``)."""
        return max(0.0, (self.size - self.level) / self.rate)


@dataclass(slots=True)
class _Limits:
    """One adapter's buckets (this router's share), and the pool-wide figures its headers name."""

    limits: RateLimits
    requests: Bucket | None
    tokens: Bucket | None
    share: float  # of the pool's limit: 1 / routers, or with shared books this router's share of the demand


def _buckets(limits: RateLimits, routers: int, now_s: float) -> _Limits:
    share = 1.0 / routers
    requests = tokens = None
    if limits.requests_per_second is not None:
        size = max(1.0, limits.request_burst * share)
        requests = Bucket(limits.requests_per_second * share, size, size, now_s)
    if limits.tokens_per_minute is not None:
        size = limits.token_burst * share
        tokens = Bucket(limits.tokens_per_minute / 60.0 * share, size, size, now_s)
    return _Limits(limits, requests, tokens, share)


def _reshare(lim: _Limits, share: float, now_s: float) -> None:
    """Give ``lim`` a new share of the pool's limit from ``now_s``: what its buckets hold stays (up to
    the new size), they refill at the new rate; a grown share hands out no burst at once."""
    for bucket, rate, burst, floor in (
        (lim.requests, lim.limits.requests_per_second, lim.limits.request_burst, 1.0),
        (lim.tokens, (lim.limits.tokens_per_minute or 0) / 60.0, lim.limits.token_burst, 0.0),
    ):
        if bucket is None or rate is None:
            continue
        bucket.fill(now_s)
        bucket.rate, bucket.size = rate * share, max(floor, burst * share)
        bucket.level = min(bucket.level, bucket.size)
    lim.share = share


@dataclass(frozen=True, slots=True)
class Allow:
    """The request is within its limits; ``charged`` tokens were taken for its prompt."""

    charged: int = 0
    headers: tuple[tuple[str, str], ...] = ()  # x-ratelimit-* for the response (none when unlimited)
    metered: bool = False  # the adapter has a token limit: settle the response's real usage

    status = 200


ALLOW = Allow()


@dataclass(frozen=True, slots=True)
class Throttle:
    """The request is over a limit: 429 with ``Retry-After`` and the x-ratelimit-* headers."""

    model: str
    limited_by: str  # "requests" or "tokens" (the throttled-requests metric's ``limit`` label)
    retry_after_s: int
    headers: tuple[tuple[str, str], ...]
    detail: str

    status = 429
    error_type = "RateLimitError"

    @property
    def message(self) -> str:
        return f"adapter {self.model!r} is over its rate limit ({self.detail}); retry after {self.retry_after_s} s"

    def all_headers(self) -> tuple[tuple[str, str], ...]:
        return (("Retry-After", str(self.retry_after_s)), *self.headers)


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def _headers(lim: _Limits) -> tuple[tuple[str, str], ...]:
    """OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}: the pool's limit, this
    router's remaining share scaled to the pool, and when its bucket is full again."""
    out: list[tuple[str, str]] = []
    for unit, bucket, size in (
        ("requests", lim.requests, lim.limits.request_burst),
        ("tokens", lim.tokens, lim.limits.token_burst),
    ):
        if bucket is None:
            continue
        remaining = max(0, math.floor(bucket.level / lim.share))
        out += [
            (f"x-ratelimit-limit-{unit}", str(int(size))),
            (f"x-ratelimit-remaining-{unit}", str(min(int(size), remaining))),
            (f"x-ratelimit-reset-{unit}", duration(bucket.full_in_s())),
        ]
    return tuple(out)


@dataclass
class RateLimiter:
    """Every limited adapter's buckets on this router; ``configure`` with each new traffic policy."""

    _limits: dict[str, _Limits] = field(default_factory=dict)
    routers: int = 1

    def configure(self, policy: TrafficPolicy, now_s: float) -> None:
        """Take a new policy: adapters whose limits and share are unchanged keep their buckets'
        levels (a re-read file does not hand out a fresh burst); the rest start full."""
        kept: dict[str, _Limits] = {}
        for model, traffic in policy.adapters.items():
            if traffic.limits is None:
                continue
            old = self._limits.get(model)
            same = old is not None and old.limits == traffic.limits and policy.routers == self.routers
            kept[model] = old if same and old is not None else _buckets(traffic.limits, policy.routers, now_s)
        self._limits, self.routers = kept, policy.routers

    def limited(self) -> Mapping[str, RateLimits]:
        return {m: lim.limits for m, lim in self._limits.items()}

    def check(self, model: str, prompt_tokens: int, now_s: float, share: float | None = None) -> Allow | Throttle:
        """Admit one request of ``model`` with about ``prompt_tokens`` prompt tokens, or say why not.
        ``share``: this router's share of the pool's limit now (shared books: its share of the demand);
        None: 1/routers, which needs no channel between routers."""
        lim = self._limits.get(model)
        if lim is None:
            return ALLOW
        share = 1.0 / self.routers if share is None else share
        if abs(share - lim.share) > 1e-3:
            _reshare(lim, share, now_s)
        need_tokens = 0.0
        waits: list[tuple[float, str, str]] = []
        if (requests := lim.requests) is not None:
            requests.fill(now_s)
            if (wait := requests.wait_s(1.0)) > 0:
                waits.append((wait, "requests", f"{lim.limits.requests_per_second:g} requests per second"))
        if (tokens := lim.tokens) is not None:
            tokens.fill(now_s)
            need_tokens = min(float(prompt_tokens), tokens.size)
            if (wait := tokens.wait_s(need_tokens)) > 0:
                waits.append((wait, "tokens", f"{lim.limits.tokens_per_minute} tokens per minute"))
        if waits:
            wait, unit, detail = max(waits)
            return Throttle(model, unit, max(1, math.ceil(wait)), _headers(lim), detail)
        if requests is not None:
            requests.level -= 1.0
        if tokens is not None:
            tokens.level -= need_tokens
        return Allow(math.ceil(need_tokens), _headers(lim), metered=tokens is not None)

    def settle(self, model: str, charged: int, used: int, now_s: float) -> None:
        """The response used ``used`` tokens where ``charged`` were taken: take (or refund) the rest."""
        lim = self._limits.get(model)
        if lim is None or (tokens := lim.tokens) is None:
            return
        tokens.fill(now_s)
        tokens.level = max(-MAX_DEBT_BURSTS * tokens.size, min(tokens.size, tokens.level - (used - charged)))
