"""The scheduler stamps each request with its adapter's traffic class from the traffic document."""

from __future__ import annotations

from lorapool.api.traffic import AdapterTraffic, Priority, TrafficPolicy
from lorapool.router.core import registry
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry


def test_request_for_carries_the_adapters_priority() -> None:
    scheduler = Scheduler(registry.build("affinity"), RouterSettings(), Telemetry())
    assert scheduler.request_for("sql").priority == Priority.STANDARD  # no document yet: the default
    scheduler.traffic = TrafficPolicy(adapters={"sql": AdapterTraffic(priority=Priority.CRITICAL)})
    assert scheduler.request_for("sql").priority == Priority.CRITICAL
    assert scheduler.request_for("chat").priority == Priority.STANDARD
