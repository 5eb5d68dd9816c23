"""The pool's autoscaling signals (docs/autoscaling.md): computed from the sidecars' reports, exported
by the operator, and every metric the shipped HPA and KEDA examples name is one lorapool exports
(read from a real router's /metrics and the operator's registry)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.models import API_VERSION
from lorapool.api.pods import engine_pod
from lorapool.api.report import AdapterLoad as ReplicaLoad
from lorapool.controller import signals
from lorapool.controller.signals import pool_signals
from lorapool.plan.holders import decide_placement
from lorapool_dev.testing.components import start_router, start_sim
from tests.delivery.test_dashboard import exported
from tests.plan.test_holders import obs, pool, reported

REPO = Path(__file__).parents[2]
EXAMPLES = REPO / "examples" / "autoscaling"
OURS = re.compile(r"\blorapool_[a-z_]+")


def test_pool_signals_from_reports_and_placement() -> None:
    p = pool(12, replicas=2)
    placement = decide_placement(p, [f"a{i}" for i in range(12)], 5, {}, {}, now=0.0)  # 2 adapters fit nowhere
    pods = [
        reported("e0", obs({"a0": ReplicaLoad(60.0, 20.0), "a1": ReplicaLoad(10.0, 0.0)})),  # p95 3 of 4 slots
        reported("e1", obs({"a2": ReplicaLoad(30.0, 5.0)})),
        reported("gone", obs({"a3": ReplicaLoad(60.0, 60.0)}), terminating=True),
        engine_pod({"metadata": {"name": "starting"}}),
    ]
    got = pool_signals(p, pods, placement)
    assert got.replicas == 2 and got.reporting_replicas == 2
    assert got.slot_pressure == 0.75
    assert got.adapters_unplaced == 2
    assert got.adapters_waiting == 2 + 2  # a0 and a2 waited; the unplaced two wait by definition


def test_a_small_pool_has_nothing_unplaced() -> None:
    p = pool(3, replicas=2)
    got = pool_signals(p, [], decide_placement(p, ["a0", "a1", "a2"], 8, {}, {}, now=0.0))
    assert (got.slot_pressure, got.adapters_waiting, got.adapters_unplaced, got.reporting_replicas) == (0.0, 0, 0, 0)


def test_loads_per_placement_change_are_counted() -> None:
    before = {"a": (0,), "b": (1,)}
    assert signals.count_loads("ml", "p-count", before, {"a": (0, 2), "b": (1,)}) == 1
    assert signals.count_loads("ml", "p-count", None, before) == 0  # from every-replica: not a move
    assert signals.PLACEMENT_LOADS.labels("ml", "p-count")._value.get() == 1


def names_in_examples() -> dict[str, set[str]]:
    """Example file -> the lorapool metrics it reads (KEDA queries, HPA metric names, adapter rules)."""
    out: dict[str, set[str]] = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        found: set[str] = set()
        for doc in yaml.safe_load_all(path.read_text()):
            found |= set(OURS.findall(yaml.safe_dump(doc)))
        out[path.name] = found
    return out


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc["spec"]["scaleTargetRef"])


def test_examples_scale_the_pool_through_its_scale_subresource() -> None:
    docs = [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    scalers = [d for d in docs if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert {d["kind"] for d in scalers} == {"ScaledObject", "HorizontalPodAutoscaler"}
    for d in scalers:
        assert targets(d) == {"apiVersion": API_VERSION, "kind": "LoRAPool", "name": "llama3-8b"}
    crd = yaml.safe_load((REPO / "crds" / "lorapool.io_lorapools.yaml").read_text())
    scale = crd["spec"]["versions"][0]["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.replicas" and scale["labelSelectorPath"] == ".status.selector"


@pytest.fixture(scope="module")
def exported_names() -> set[str]:
    from prometheus_client import REGISTRY, generate_latest

    with (
        start_sim(served_model_name="m", max_loras=2, timeout_s=60) as sim,
        start_router([sim.url], health_path="/health", timeout_s=60) as router,
    ):
        router_page = urllib.request.urlopen(f"{router.url}/metrics", timeout=10).read().decode()
    return exported(router_page) | exported(generate_latest(REGISTRY).decode())


def test_every_metric_the_examples_read_is_exported(exported_names: set[str]) -> None:
    wanted = names_in_examples()
    assert wanted["keda-scaledobject.yaml"] >= {"lorapool_router_queued_requests", "lorapool_pool_slot_pressure"}
    assert wanted["hpa.yaml"] >= {"lorapool_pool_adapters_waiting"}
    missing = {f: sorted(n - exported_names) for f, n in wanted.items() if n - exported_names}
    assert not missing, f"the examples read metrics nothing exports: {missing}"


def test_the_docs_table_names_every_signal_the_operator_exports() -> None:
    text = (REPO / "docs" / "autoscaling.md").read_text()
    for name in signals.NAMES:
        assert name.removesuffix("_total") in text, name
