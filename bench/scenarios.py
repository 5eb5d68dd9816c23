"""The benchmark matrix: regimes x arrival processes, and the systems compared on each.

All times in a scenario are simulated seconds; the runner stretches them by the simulator's
``--time-scale`` so that 2 cores can keep up, and converts the measurements back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.loadgen import Workload
from bench.systems import FleetSpec, System
from lorapool.api.common import RouterPolicy
from lorapool.router.core import registry

TIME_SCALE = 4.0  # wall seconds per simulated second (see RESULTS.md, "How to read")
REPLICAS = 4
MAX_LORAS = 4
SLO_TTFT_S = 0.5


@dataclass(frozen=True)
class Scenario:
    name: str
    regime: str
    about: str
    fleet: FleetSpec
    workload: Workload
    warmup_s: float = 2.5
    slo_ttft_s: float = SLO_TTFT_S


def _fleet(adapters: int, max_cpu_loras: int) -> FleetSpec:
    return FleetSpec(
        replicas=REPLICAS,
        adapters=adapters,
        max_loras=MAX_LORAS,
        max_cpu_loras=max_cpu_loras,
        time_scale=TIME_SCALE,
    )


def _work(adapters: int, rate: float, **kw: object) -> Workload:
    base = Workload(
        rate_rps=rate,
        duration_s=12.5,
        adapters=adapters,
        prompt_tokens=(64, 512),
        output_tokens=(16, 64),
        seed=7,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "a-uniform-poisson",
        "a",
        "16 adapters = replicas x max-loras, uniform, Poisson 40 req/s",
        _fleet(16, 16),
        _work(16, 40.0),
    ),
    Scenario(
        "a-zipf-gamma",
        "a",
        "16 adapters, Zipf 1.0, bursty Gamma CV 3, 40 req/s",
        _fleet(16, 16),
        _work(16, 40.0, popularity="zipf", arrival="gamma", cv=3.0),
    ),
    Scenario(
        "b-zipf-poisson",
        "b",
        "256 adapters, Zipf 1.0, CPU cache 32/replica, Poisson 25 req/s",
        _fleet(256, 32),
        _work(256, 25.0, popularity="zipf"),
    ),
    Scenario(
        "b-zipf-gamma",
        "b",
        "256 adapters, Zipf 1.0, CPU cache 32/replica, Gamma CV 3, 25 req/s",
        _fleet(256, 32),
        _work(256, 25.0, popularity="zipf", arrival="gamma", cv=3.0),
    ),
    Scenario(
        "c-uniform-poisson",
        "c",
        "2000 adapters, uniform, CPU cache 64/replica, Poisson 12 req/s",
        _fleet(2000, 64),
        _work(2000, 12.0),
    ),
    Scenario(
        "d-hot-poisson",
        "d",
        "64 adapters, one takes 60 % of traffic (rest Zipf), Poisson 40 req/s",
        _fleet(64, 64),
        _work(64, 40.0, popularity="hot", hot_share=0.6),
    ),
)


def lorapool_system(policy: RouterPolicy) -> System:
    """``lorapool router --policy <policy>``, named "lorapool <policy>" in results."""
    return System(f"lorapool {policy}", "lorapool", str(policy))


LORAPOOL_AFFINITY = lorapool_system(RouterPolicy.AFFINITY).name
LORAPOOL_ROUND_ROBIN = lorapool_system(RouterPolicy.ROUND_ROBIN).name

# The upper bound: every adapter always resident, loads free, same KV cache (systems.oracle_fleet);
# with nothing to group, spreading load is all that is left, so least-loaded routes it.
ORACLE = "oracle (adapters always resident)"
# Affinity with the hold rule issue 12 proposed (a request whose adapter runs nowhere is sent at
# once, not held): measured beside the default, a variant of affinity, not a baseline.
AFFINITY_HOLD_IF_ACTIVE = "lorapool affinity (hold-if-active)"
# Regime (e) (bench/large_catalog.py): affinity routing plus the operator's k-of-N placement, the
# product itself, not a baseline.
LORAPOOL_PLACEMENT = "lorapool placement"
# Issue 24: the same affinity policy as a GIE endpoint picker behind a real Envoy (the product's
# second front door, not a baseline): Envoy carries the bytes, the picker decides.
ENVOY_PICKER = "envoy + lorapool picker"
# The picker's floors, in the overhead cell only: Envoy alone, and Envoy asking an ext_proc server
# that picks without a policy (bench/noop_ext_proc.py).
ENVOY_ALONE = "envoy round-robin"
ENVOY_NOOP = "envoy + no-op ext_proc"
NOT_BASELINES = (LORAPOOL_AFFINITY, ORACLE, AFFINITY_HOLD_IF_ACTIVE, LORAPOOL_PLACEMENT, ENVOY_PICKER)

SYSTEMS: tuple[System, ...] = (
    *(lorapool_system(policy) for policy in registry.POLICIES),  # every --policy the router has
    System(ORACLE, "lorapool", str(RouterPolicy.LEAST_LOADED), oracle=True),
    System(AFFINITY_HOLD_IF_ACTIVE, "lorapool", str(RouterPolicy.AFFINITY), ("--hold-rule", "hold-if-active")),
    System(ENVOY_PICKER, "envoy-picker", str(RouterPolicy.AFFINITY)),
    System("nginx round-robin", "nginx"),
    System("vllm-router round_robin", "vllm-router", "round_robin"),
    System("vllm-router power_of_two", "vllm-router", "power_of_two"),
    System("vllm-router cache_aware", "vllm-router", "cache_aware"),
    System("vllm-router consistent_hash", "vllm-router", "consistent_hash"),
)
