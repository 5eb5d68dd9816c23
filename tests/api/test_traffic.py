"""The traffic document the operator writes for the router: strict, versioned, defaults for the rest."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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
