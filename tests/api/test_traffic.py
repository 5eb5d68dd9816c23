"""The traffic document the operator writes for the router: strict, versioned, defaults for the rest."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lorapool.api.models import LoRAAdapter
from lorapool.api.traffic import DEFAULT_TRAFFIC, AdapterTraffic, Priority, RateLimits, TrafficPolicy


def test_round_trip_in_camel_case() -> None:
    policy = TrafficPolicy(
        pool="llama",
        adapters={
            "sql": AdapterTraffic(
                priority=Priority.CRITICAL, limits=RateLimits(requests_per_second=5, tokens_per_minute=60000)
            )
        },
    )
    text = policy.to_json()
    assert '"requestsPerSecond": 5.0' in text and '"tokensPerMinute": 60000' in text
    assert "burstRequests" not in text  # unset stays unset: the router applies the default
    assert TrafficPolicy.from_json(text) == policy


def test_an_adapter_without_rules_gets_the_defaults() -> None:
    policy = TrafficPolicy(adapters={"sql": AdapterTraffic(priority=Priority.SHEDDABLE)})
    assert policy.of("sql").priority == Priority.SHEDDABLE
    assert policy.of("chat") is DEFAULT_TRAFFIC
    assert DEFAULT_TRAFFIC.priority == Priority.STANDARD and DEFAULT_TRAFFIC.limits is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"adapters": {"sql": {"priority": "urgent"}}}', "priority"),
        ('{"adapters": {"sql": {"limits": {"requestsPerSecond": 0}}}}', "requestsPerSecond"),
        ('{"adapters": {"sql": {"limits": {"tokensPerMinute": -1}}}}', "tokensPerMinute"),
        ('{"adapters": {"sql": {"limits": {"burstRequests": 0}}}}', "burstRequests"),
        ('{"adapters": {"sql": {"weight": 2}}}', "weight"),  # unknown fields are refused, not ignored
    ],
)
def test_bad_rules_are_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        TrafficPolicy.from_json(text)


@pytest.mark.parametrize(
    ("objective", "expected"), [(5, Priority.CRITICAL), (0, Priority.STANDARD), (-1, Priority.SHEDDABLE)]
)
def test_gateway_objective_priorities_map_onto_the_classes(objective: int, expected: Priority) -> None:
    assert Priority.from_objective(objective) == expected


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ({}, "requestsPerSecond or tokensPerMinute"),
        ({"burstRequests": 5, "tokensPerMinute": 100}, "burstRequests must be given with requestsPerSecond"),
        ({"burstTokens": 5, "requestsPerSecond": 1}, "burstTokens must be given with tokensPerMinute"),
    ],
)
def test_limits_that_would_limit_nothing_are_refused_saying_the_fix(limits: dict[str, int], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        RateLimits.model_validate(limits)


def test_bursts_default_to_one_second_of_requests_and_one_minute_of_tokens() -> None:
    assert RateLimits(requests_per_second=0.5).request_burst == 1.0  # at least one request
    assert RateLimits(requests_per_second=20).request_burst == 20.0
    assert RateLimits(requests_per_second=20, burst_requests=3).request_burst == 3.0
    assert RateLimits(tokens_per_minute=6000).token_burst == 6000.0
    assert RateLimits(tokens_per_minute=6000, burst_tokens=100).token_burst == 100.0


def test_a_loraadapters_traffic_reaches_the_pool_form() -> None:
    adapter = LoRAAdapter.model_validate(
        {
            "metadata": {"name": "legal", "namespace": "ml"},
            "spec": {
                "poolRef": {"name": "llama3-8b"},
                "source": "hf://acme/legal",
                "traffic": {"priority": "critical", "limits": {"requestsPerSecond": 2}},
            },
        }
    )
    traffic = adapter.as_adapter().traffic
    assert traffic is not None and traffic.priority == Priority.CRITICAL
    assert traffic.limits == RateLimits(requests_per_second=2)
