"""Issue 47's two modes end to end at a small scale: the GIE endpoint picker (built from the Go module
proxy into ~/.cache/lorapool, its pool on a real kube-apiserver) behind a real Envoy routing a
real open-loop run, and inference-perf (its own Python 3.12 venv, a local tokenizer) driving a cell
through ``bench/run.py --loadgen inference-perf``.

Measured on the shared 2-core machine (load average ~10): warm, the EPP test takes ~26 s and the
inference-perf test ~35 s. Cold, the EPP's build is 8-10 min (473 s with its module downloads;
617 s from downloaded modules with `-trimpath`, as cluster.build builds) and inference-perf's venv
~6-10 min of pip (347 s with a warm pip cache); each is paid once per machine, by the first test
that needs it, then cached under ~/.cache/lorapool.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import run
from bench.loadgen import Workload
from bench.scenarios import GIE_EPP_LORA, SCENARIOS, Scenario
from bench.systems import FleetSpec, System

TINY = Scenario(
    "tiny-poisson",
    "a",
    "4 adapters on 2 replicas, Poisson 6 req/s for 5 s",
    FleetSpec(replicas=2, adapters=4, max_loras=2, max_cpu_loras=4, time_scale=1.0),
    Workload(rate_rps=6.0, duration_s=5.0, adapters=4, prompt_tokens=(32, 64), output_tokens=(4, 8), seed=3),
    warmup_s=1.0,
)


@pytest.fixture
def adapter_root(tmp_path: Path) -> Path:
    return tmp_path / "adapters"


@pytest.mark.cluster
@pytest.mark.envoy
@pytest.mark.slow
@pytest.mark.timeout(1500)  # a cold EPP build is ~8 min (then cached); the run itself ~1 min
def test_the_gie_epp_routes_a_cell_behind_envoy(adapter_root: Path) -> None:
    from lorapool_dev.peer import ensure_epp

    binary, _ = ensure_epp()
    assert binary.is_file()
    cell = run.run_one(TINY, System(GIE_EPP_LORA, "gie-epp", "3"), adapter_root)
    assert cell["system"] == GIE_EPP_LORA and cell["requests"] >= 15
    assert cell["failed"] == 0, cell["codes"]
    assert cell["goodput_rps"] > 0 and cell["ttft_p99_s"] < 5.0


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a cold venv is ~10 min of pip; the run itself ~1-2 min
def test_inference_perf_drives_a_cell_and_its_reports_stay_beside_ours(
    tmp_path: Path, adapter_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_ADAPTERS", str(adapter_root))
    monkeypatch.setattr(run, "SCENARIOS", (TINY,))
    out = tmp_path / "results"
    argv = ["--out", str(out), "--loadgen", "inference-perf", "--only", TINY.name, "--systems", "lorapool affinity"]
    assert run.main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    (cell,) = data["inference_perf"]["runs"]
    assert "error" not in cell, cell.get("error")
    assert cell["loadgen"] == "inference-perf" and cell["system"] == "lorapool affinity"
    assert cell["requests"] >= 10 and cell["failed"] == 0 and cell["goodput_rps"] > 0
    assert (out / cell["report_dir"] / "per_request_lifecycle_metrics.json").is_file()
    assert (out / cell["report_dir"] / "summary_lifecycle_metrics.json").is_file()
    assert data["runs"] == []  # our own load generator's cells are left alone
    assert (out.parent / "RESULTS.md").read_text().startswith("# Routing benchmark results")


def test_inference_perf_refuses_a_bursty_cell_before_starting_anything(tmp_path: Path) -> None:
    gamma = next(s for s in SCENARIOS if s.name == "a-zipf-gamma")
    with pytest.raises(ValueError, match="Poisson single-turn"):
        run.run_one_inference_perf(gamma, System("direct", "direct"), tmp_path / "adapters", tmp_path / "r")
