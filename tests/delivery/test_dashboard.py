"""The Grafana dashboard in the chart asks only for metrics that exist: every series named in a
PromQL expression is one our router, sidecar, operator or vLLM (through the simulator, whose
names the conformance tier holds to real vLLM's) exports, read from their /metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool_dev.testing.components import start_router, start_sidecar, start_sim
from tests.delivery.helm import CHART, helm

DASHBOARD = CHART / "dashboards" / "lorapool.json"
SERIES = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
OURS = re.compile(r"\b(?:lorapool_[a-z_]+|vllm:[a-z_:]+)")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"), "gauge": ("",)}


def expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return exprs + [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]


def series_in(expr: str) -> set[str]:
    """Series selected in one expression: every ``name{...}`` and label_values' first argument."""
    names = set(SERIES.findall(expr)) | set(re.findall(r"label_values\(\s*([a-zA-Z_:][\w:]*)", expr))
    bare = set(OURS.findall(expr)) - names
    assert not bare, f"write every series as name{{...}} so it is checked: {bare} in {expr}"
    return names


def exported(text: str) -> set[str]:
    """Sample names a /metrics page can carry, from its TYPE lines (a family without samples yet counts)."""
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))  # samples present
    for family, kind in re.findall(r"^# TYPE (\S+) (\w+)$", text, re.M):
        stem = family.removesuffix("_total") if kind == "counter" else family
        names |= {stem + s for s in SUFFIXES.get(kind, ("",))}
    return names


@pytest.fixture(scope="module")
def exported_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    import urllib.request

    from prometheus_client import REGISTRY, generate_latest

    # The operator's metrics live at module level in these three; imported here, not left to
    # whichever test ran before (alone, this test once missed the work queue's).
    import lorapool.controller.kube
    import lorapool.controller.reconcile
    import lorapool.controller.workqueue  # noqa: F401

    def page(url: str) -> str:
        return urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()

    tmp = tmp_path_factory.mktemp("dashboard")
    config = tmp / "adapters.json"
    config.write_text(json.dumps({"pool": "p", "baseModel": "m", "maxLoraRank": 8, "adapters": []}))
    with (
        start_sim(served_model_name="m", max_loras=2, timeout_s=60) as sim,
        start_router([sim.url], health_path="/health", timeout_s=60) as router,
        start_sidecar(config=config, engine_url=sim.url, adapter_dir=tmp / "adapters") as sidecar,
    ):
        pages = [page(sim.url), page(router.url), page(sidecar.url)]
    return set().union(*(exported(p) for p in [*pages, generate_latest(REGISTRY).decode()]))


def test_every_series_in_the_dashboard_is_exported(exported_names: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = set().union(*(series_in(e) for e in expressions(dashboard)))
    assert {"lorapool_router_decisions_total", "lorapool_sidecar_loads_total", "vllm:kv_cache_usage_perc"} <= wanted
    assert not wanted - exported_names, (
        f"the dashboard asks for series nothing exports: {sorted(wanted - exported_names)}"
    )


def test_dashboard_covers_what_users_look_at() -> None:
    text = DASHBOARD.read_text()
    for needed in ("time_to_first_token", "decisions", "loads", "lora_requests_info", "kv_cache", "queue", "requests"):
        assert needed in text, needed
    titles = [p["title"] for p in json.loads(text)["panels"] if p["type"] == "row"]
    assert titles[:2] == ["Pool: traffic through the router", "Per adapter"]


def test_chart_ships_it_as_a_configmap_for_grafanas_sidecar(tmp_path: Path) -> None:
    import kubernetes_validate

    result = helm(
        "template", "x", str(CHART), "--namespace", "lorapool-system", "--set", "grafanaDashboard.enabled=true"
    )
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["lorapool.json"]) == json.loads(DASHBOARD.read_text())
    kubernetes_validate.validate(cm, "1.36.0", strict=True)
    off = helm("template", "x", str(CHART)).stdout
    assert "-dashboard" not in off
