"""Issue 47's pure parts: the GIE EPP's config, pool and Pods (lorapool_dev/peer.py), inference-perf's
config and records (bench/inference_perf.py), and the ``peer: `` targets read out of results.json."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import inference_perf as ip
from bench import peer_report, run
from bench.loadgen import Workload
from bench.scenarios import (
    ENVOY_PICKER,
    ENVOY_PICKER_FAIR,
    ENVOY_PICKER_PREFIX,
    GIE_EPP_DEFAULT,
    GIE_EPP_LORA,
    SCENARIOS,
    SYSTEMS,
)
from bench.targets import TARGETS
from lorapool_dev import peer


def test_the_default_config_is_the_epps_own_and_the_lora_config_adds_only_its_scorer() -> None:
    assert peer.epp_config(None) is None  # no --config-text: the EPP's built-in default
    config = yaml.safe_load(peer.epp_config(3.0) or "")
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    assert weights == {**peer.DEFAULT_WEIGHTS, "lora-affinity-scorer": 3.0}
    assert {p["type"] for p in config["plugins"]} == set(weights)


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan])
def test_a_lora_weight_that_is_not_positive_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="lora_weight must be > 0"):
        peer.epp_config(weight)


def test_each_pod_is_narrowed_to_its_own_port_and_the_pool_spans_them() -> None:
    pool = peer.pool_manifest("bench", [8001, 8002], 9002)
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [8001, 8002]
    assert pool["spec"]["selector"]["matchLabels"] == peer.POOL_LABEL
    pod = peer.pod_manifest(1, 8002)
    assert pod["metadata"]["annotations"] == {peer.ACTIVE_PORTS: "8002"}
    assert pod["metadata"]["labels"] == peer.POOL_LABEL
    status = peer.pod_status("2026-01-01T00:00:00Z")
    assert (
        status["podIP"] == "127.0.0.1"
        and {"type": "Ready", "status": "True"}.items() <= status["conditions"][-1].items()
    )


@pytest.mark.parametrize("count", [0, 9])
def test_a_pool_outside_the_apis_target_port_limit_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="1 to 8 targetPorts"):
        peer.pool_manifest("bench", list(range(8000, 8000 + count)), 9002)


def test_the_epps_metric_clocks_stretch_with_the_time_scale() -> None:
    args = peer.epp_args("bench", {"grpc": 1, "health": 2, "metrics": 3}, 4.0, None)
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--refresh-metrics-interval"] == "200ms" and flags["--metrics-staleness-threshold"] == "8000ms"
    assert "--config-text" not in args
    assert peer.epp_args("bench", {"grpc": 1, "health": 2, "metrics": 3}, 1.0, "x")[-2:] == ["--config-text", "x"]


@pytest.mark.parametrize("name", ["a-uniform-poisson", "b-zipf-poisson", "d-hot-poisson", "c-uniform-poisson"])
def test_the_traffic_split_sums_to_exactly_one_and_follows_the_popularity(name: str) -> None:
    w = next(s for s in SCENARIOS if s.name == name).workload
    split = ip.traffic_split(w)
    assert sum(s["split"] for s in split) == 1.0  # inference-perf 0.7.0 checks with ==
    assert len(split) == w.adapters and all(s["split"] > 0 for s in split)
    if w.popularity != "uniform":
        assert split[0]["split"] > split[-1]["split"]


def test_inference_perf_runs_the_scenario_in_wall_time() -> None:
    w = next(s for s in SCENARIOS if s.name == "a-uniform-poisson").workload
    cfg = ip.config(w, url="http://x", model="m", tokenizer=Path("/t"), report_dir=Path("/r"), time_scale=4.0)
    (stage,) = cfg["load"]["stages"]
    assert stage == {"rate": w.rate_rps / 4.0, "duration": w.duration_s * 4.0}
    assert cfg["data"]["input_distribution"]["min"] == w.prompt_tokens[0] and cfg["api"]["streaming"] is True


@pytest.mark.parametrize("change", [{"arrival": "gamma"}, {"flood": "lora-0001"}])
def test_inference_perf_refuses_what_it_cannot_drive(change: dict[str, Any]) -> None:
    w = replace(Workload(rate_rps=1.0, duration_s=1.0, adapters=2), **change)
    with pytest.raises(ValueError, match="Poisson single-turn scenarios only"):
        ip.config(w, url="http://x", model="m", tokenizer=Path("/t"), report_dir=Path("/r"), time_scale=1.0)


def test_inference_perfs_records_become_outcomes_in_simulated_seconds() -> None:
    ok = {
        "start_time": 100.0,
        "end_time": 104.0,
        "error": None,
        "info": {"lora_adapter": "lora-0001", "response_metrics": {"output_tokens": 3, "output_token_times": [102.0]}},
    }
    failed = {"start_time": 108.0, "end_time": 109.0, "error": {"error_type": "500", "error_msg": "boom"}, "info": {}}
    first, second = ip.outcomes([ok, failed], time_scale=2.0)
    assert (first.model, first.sent_s, first.ttft_s, first.done_s, first.tokens) == ("lora-0001", 0.0, 1.0, 2.0, 3)
    assert second.sent_s == 4.0 and second.status == 0 and second.error == "500: boom" and second.ttft_s is None
    assert ip.within([first, second], warmup_s=1.0) == [second]


def _run(system: str, goodput: float, p99: float, date: str = "d") -> dict[str, Any]:
    return {"system": system, "goodput_rps": goodput, "ttft_p99_s": p99, "ttft_p50_s": 0.1, "stalls_per_1k": 5.0,
            "date": date}  # fmt: skip


def _data() -> dict[str, Any]:
    scenarios = [{"name": "a-x", "regime": "a"}, {"name": "g-x", "regime": "g"}]
    runs = [
        {"scenario": "a-x", **_run(ENVOY_PICKER, 10.0, 1.0)},
        {"scenario": "a-x", **_run(GIE_EPP_LORA, 10.0, 2.0)},
        {"scenario": "a-x", **_run(GIE_EPP_DEFAULT, 12.0, 1.0)},
        {"scenario": "g-x", **_run(ENVOY_PICKER, 1.0, 9.0)},  # not ours in (g): the prefix picker is
        {"scenario": "g-x", **_run(ENVOY_PICKER_PREFIX, 7.5, 1.0)},
        {"scenario": "g-x", **_run(GIE_EPP_LORA, 10.0, 1.0)},
    ]
    theirs = [{"scenario": "a-x", **_run(ENVOY_PICKER, 5.0, 1.0)}, {"scenario": "a-x", **_run(GIE_EPP_LORA, 4.0, 1.0)}]
    overhead = {"rates": {"100": {ENVOY_PICKER: {"added_p50_ms": 1.5, "added_p99_ms": 2.0},
                                  GIE_EPP_LORA: {"added_p50_ms": 1.0, "added_p99_ms": 2.5}}}}  # fmt: skip
    return {"date": "d", "scenarios": scenarios, "runs": runs, "inference_perf": {"runs": theirs},
            "overhead": overhead}  # fmt: skip


def test_the_peer_cells_pair_each_regimes_best_picker_with_each_epp_config() -> None:
    cells = dict(peer_report.ratio_cells("goodput_rps")(_data()))
    assert cells == {
        f"a-x vs {GIE_EPP_LORA}": 1.0,
        f"a-x vs {GIE_EPP_DEFAULT}": 10.0 / 12.0,
        f"g-x vs {GIE_EPP_LORA}": 0.75,
        f"a-x vs {GIE_EPP_LORA}, inference-perf": 1.25,
    }
    assert dict(peer_report.overhead_cells("added_p50_ms")(_data())) == {"100 req/s": 0.5}


def test_the_peer_targets_give_verdicts_from_the_cells() -> None:
    peers = {t.what: t for t in TARGETS if t.what.startswith("peer: ")}
    assert len(peers) == 4
    verdicts = {what: t.verdict(_data())[1] for what, t in peers.items()}
    goodput = next(w for w in verdicts if "goodput" in w)
    assert verdicts[goodput] == "missed"  # 10/12 < 0.97 against the default config
    assert "a-x: gie epp (default) 12.0 req/s vs 10.0" in (peers[goodput].why or str)(_data())
    p99 = next(w for w in verdicts if "p99 TTFT" in w)
    assert verdicts[p99] == "met"
    assert next(v for w, v in verdicts.items() if "added p50" in w) == "missed"  # 0.5 ms slower
    assert next(v for w, v in verdicts.items() if "added p99" in w) == "met"  # 0.5 ms faster
    assert peers[goodput].verdict({"runs": [], "scenarios": []})[1] == "not measured"
    section = "\n".join(peer_report.section(_data()))
    assert "v1.5.0" in section and f"| {GIE_EPP_LORA} | inference-perf | 4.0 |" in section


def test_the_regimes_own_picker_configs_run_only_where_their_regime_names_them() -> None:
    pairs = run.cells(list(SCENARIOS), list(SYSTEMS), systems_chosen=False)
    where = {name: {s.name for s, sys in pairs if sys.name == name} for name in (ENVOY_PICKER_FAIR, GIE_EPP_LORA)}
    assert where[ENVOY_PICKER_FAIR] == {"f-quiet", "f-flood"}
    assert {s.name for s in SCENARIOS} - {"e-zipf-shift"} <= where[GIE_EPP_LORA]


def test_the_peers_own_overhead_run_is_read_before_the_overhead_cell() -> None:
    data = _data()
    side_by_side = {ENVOY_PICKER: {"added_p50_ms": 0.8, "added_p99_ms": 2.0, "errors": 0},
                    GIE_EPP_LORA: {"added_p50_ms": 1.0, "added_p99_ms": 1.5, "errors": 0}}  # fmt: skip
    data["peer_overhead"] = {"rates": {"100": side_by_side}, "repeats": 3, "date": "d", "command": "c"}
    assert dict(peer_report.overhead_cells("added_p50_ms")(data)) == {"100 req/s": pytest.approx(-0.2)}
    assert "| 100 | gie epp (lora-affinity) | 1.00 | 1.50 | 0 |" in peer_report.section(data)
    data["peer_overhead"] = {"rates": {"100": {ENVOY_PICKER: side_by_side[ENVOY_PICKER]}}}  # no EPP: the cell's
    assert dict(peer_report.overhead_cells("added_p50_ms")(data)) == {"100 req/s": 0.5}


def test_the_peer_overhead_mode_folds_its_run_into_a_fresh_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import overhead

    side_by_side = {
        name: {"added_p50_ms": 1.0, "added_p99_ms": 2.0, "errors": 0} for name in (ENVOY_PICKER, GIE_EPP_LORA)
    }
    monkeypatch.setattr(overhead, "run_peer_overhead", lambda root: {"rates": {"100": side_by_side}, "repeats": 3})
    out = tmp_path / "new" / "results"
    assert run.main(["--out", str(out), "--peer-overhead"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["peer_overhead"]["rates"]["100"] == side_by_side and data["runs"] == []
    assert data["peer_overhead"]["command"].endswith("--peer-overhead")
    assert "| 100 | envoy + lorapool picker | 1.00 | 2.00 | 0 |" in (out.parent / "RESULTS.md").read_text()
