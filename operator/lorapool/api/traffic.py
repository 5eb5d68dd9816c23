"""Per-adapter traffic rules: priority and rate limits. Pure data.

The API fields (``spec.adapters[].traffic`` of a LoRAPool, ``spec.traffic`` of a LoRAAdapter)
and the document the operator writes to ConfigMap ``<pool>-traffic`` (key ``traffic.json``) for
the router, which reads it with ``--traffic-file``. Like the sidecars' ``AdapterSet`` it is the
whole contract between the operator and the router on this subject, so it is versioned and strict.

Priority is a small ordered set, not an integer as Gateway API Inference Extension's
``InferenceObjective.priority``: three classes are what a router can keep apart under a flood
(served first, served, shed first), a name says what it does where an integer says only "more",
and every class has one documented weight. GIE's integers map onto it: > 0 critical, 0 standard,
< 0 sheddable (GIE sheds negative priorities first too).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from lorapool.api.fields import Document

TRAFFIC_API_VERSION = "lorapool.io/v1alpha1"
TRAFFIC_CONFIGMAP_KEY = "traffic.json"


class Priority(StrEnum):
    """An adapter's traffic class, most important first."""

    CRITICAL = "critical"  # served first when the pool is saturated, never shed before the others
    STANDARD = "standard"  # the default
    SHEDDABLE = "sheddable"  # shed first (429) when the pool cannot keep up

    @classmethod
    def from_objective(cls, priority: int) -> Priority:
        """GIE's InferenceObjective integer priority as a class (> 0 critical, 0 standard, < 0 sheddable)."""
        return cls.CRITICAL if priority > 0 else cls.STANDARD if priority == 0 else cls.SHEDDABLE

    @property
    def rank(self) -> int:
        """0 for critical, 1 standard, 2 sheddable: lower is served first."""
        return PRIORITY_ORDER.index(self)


PRIORITY_ORDER: tuple[Priority, ...] = (Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE)


def _cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL ``x-kubernetes-validations`` for the CRD (``api.models.cel``'s shape; that module imports this one)."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


# (CEL rule, message, the Python check): the API server and `lorapool plan` refuse the same limits.
_LIMIT_RULES: tuple[tuple[str, str], ...] = (
    (
        "has(self.requestsPerSecond) || has(self.tokensPerMinute)",
        "limits must be given requestsPerSecond or tokensPerMinute (or both): set one, or remove limits",
    ),
    (
        "!has(self.burstRequests) || has(self.requestsPerSecond)",
        "burstRequests must be given with requestsPerSecond: set requestsPerSecond or remove burstRequests",
    ),
    (
        "!has(self.burstTokens) || has(self.tokensPerMinute)",
        "burstTokens must be given with tokensPerMinute: set tokensPerMinute or remove burstTokens",
    ),
)


class RateLimits(Document):
    """Token-bucket limits for one adapter, for the whole pool (every router replica together)."""

    model_config = ConfigDict(json_schema_extra=_cel(*_LIMIT_RULES))

    requests_per_second: float | None = Field(
        default=None, gt=0, le=100000, description="Sustained requests per second; unset: no request limit."
    )
    burst_requests: int | None = Field(
        default=None,
        ge=1,
        le=1000000,
        description="Requests allowed at once above the sustained rate; default: one second's worth (at least 1).",
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=10**10,
        description="Sustained prompt + completion tokens per minute; unset: no token limit.",
    )
    burst_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10**10,
        description="Tokens allowed at once above the sustained rate; default: one minute's worth.",
    )

    @model_validator(mode="after")
    def _rules(self) -> RateLimits:
        checks = (
            self.requests_per_second is not None or self.tokens_per_minute is not None,
            self.burst_requests is None or self.requests_per_second is not None,
            self.burst_tokens is None or self.tokens_per_minute is not None,
        )
        for holds, (_rule, message) in zip(checks, _LIMIT_RULES, strict=True):
            if not holds:
                raise ValueError(message)
        return self

    @property
    def request_burst(self) -> float:
        """The request bucket's size: burstRequests, else one second's worth (at least 1)."""
        rate = self.requests_per_second or 0.0
        return float(self.burst_requests) if self.burst_requests is not None else max(1.0, rate)

    @property
    def token_burst(self) -> float:
        """The token bucket's size: burstTokens, else one minute's worth."""
        return float(self.burst_tokens if self.burst_tokens is not None else self.tokens_per_minute or 0)


class AdapterTraffic(Document):
    """How the router treats one adapter's requests."""

    priority: Priority = Field(default=Priority.STANDARD, description="critical, standard or sheddable.")
    limits: RateLimits | None = Field(default=None, description="Rate limits; unset: none.")


DEFAULT_TRAFFIC = AdapterTraffic()


class TrafficPolicy(Document):
    """Every adapter's traffic rules for one pool: what ``--traffic-file`` holds."""

    api_version: str = Field(default=TRAFFIC_API_VERSION, alias="apiVersion")
    kind: str = Field(default="TrafficPolicy")
    pool: str = ""
    # Router replicas sharing the limits: each enforces 1/routers of every limit (api docstring of
    # ``router.core.ratelimit`` says why a share and not a shared counter).
    routers: int = Field(default=1, ge=1)
    # Adapters not listed (and the base model) get DEFAULT_TRAFFIC.
    adapters: dict[str, AdapterTraffic] = Field(default_factory=dict)

    def of(self, model: str) -> AdapterTraffic:
        """The rules for ``model``; the defaults when it has none."""
        return self.adapters.get(model, DEFAULT_TRAFFIC)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> TrafficPolicy:
        return cls.model_validate_json(text)
