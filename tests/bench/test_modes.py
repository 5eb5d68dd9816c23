"""Every mode of ``bench/run.py`` writes its cells, results.json and RESULTS.md into a fresh ``--out``.

A mode that measured for minutes and then died reading a results file the fresh directory did not
have lost the run (``--large-catalog`` did). Here each mode runs through ``run.main`` with its
measurement replaced by a cell taken from the committed results (the measuring itself is covered
by the cells' own tests and by the benchmark); what is tested is everything after it: the fold into
results.json, the mode's own file, the plots and the report.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import chaos, large_catalog, large_catalog_report, real_engine, results, run, sizing
from tests.delivery.helm import REPO

COMMITTED = REPO / "bench" / "results"


def committed(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((COMMITTED / name).read_text())
    return data


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """An --out directory that does not exist yet, inside a directory with no RESULTS.md."""
    return tmp_path / "new" / "results"


def reported(out: Path) -> None:
    assert (out.parent / "RESULTS.md").read_text().startswith("# Routing benchmark results")


def written(out: Path) -> dict[str, Any]:
    """results.json of a mode that folds its cells into it, after its report was written."""
    reported(out)
    data: dict[str, Any] = json.loads(results.path(out).read_text())
    return data


def test_cells_of_one_scenario(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cell = next(r for r in committed("results.json")["runs"] if r["scenario"] == "a-uniform-poisson")
    monkeypatch.setattr(run, "run_one", lambda scenario, system, root: {**cell, "system": system.name})
    argv = ["--out", str(fresh), "--only", "a-uniform-poisson", "--systems", "lorapool affinity", "--skip-overhead"]
    assert run.main(argv) == 0
    data = written(fresh)
    assert [(r["scenario"], r["system"]) for r in data["runs"]] == [("a-uniform-poisson", "lorapool affinity")]
    assert (fresh / "goodput.png").exists()


def test_merge_into_a_fresh_directory(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cell = next(r for r in committed("results.json")["runs"] if r["scenario"] == "a-uniform-poisson")
    monkeypatch.setattr(run, "run_one", lambda scenario, system, root: {**cell, "system": system.name})
    argv = ["--out", str(fresh), "--merge", "--skip-overhead", "--only", "a-uniform-poisson"]
    assert run.main([*argv, "--systems", "lorapool affinity"]) == 0
    assert run.main([*argv, "--systems", "lorapool round-robin"]) == 0
    assert {r["system"] for r in written(fresh)["runs"]} == {"lorapool affinity", "lorapool round-robin"}


def test_overhead_only(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overhead = committed("results.json")["overhead"]
    monkeypatch.setattr(run, "run_overhead", lambda root: overhead)
    assert run.main(["--out", str(fresh), "--overhead-only"]) == 0
    assert written(fresh)["overhead"]["command"] == " ".join(
        ["python", "bench/run.py", "--out", str(fresh), "--overhead-only"]
    )


def test_large_catalog(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = large_catalog.catalog_scenario().name
    cells = {r["system"]: r for r in committed("results.json")["runs"] if r["scenario"] == scenario}
    monkeypatch.setattr(large_catalog, "run_cell", lambda s, system, root: cells[system.name])
    assert run.main(["--out", str(fresh), "--large-catalog"]) == 0
    data = written(fresh)
    assert {r["system"] for r in data["runs"]} == set(cells)
    assert [s["name"] for s in data["scenarios"]] == [scenario]
    assert (fresh / large_catalog_report.PLOT).exists()


def test_real_engine(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = {(r["engine"], r["system"]): r for r in committed(real_engine.RESULTS_FILE)["runs"]}
    engine = iter(["vllm", "vllm", "sim", "sim"])  # the order run() measures them in

    @contextlib.contextmanager
    def no_fleet(spec: Any, root: Path) -> Iterator[tuple[list[str], Any]]:
        yield [], lambda: 0.0

    monkeypatch.setattr(real_engine, "vllm_fleet", no_fleet)
    monkeypatch.setattr(real_engine, "sim_fleet", no_fleet)
    monkeypatch.setattr(real_engine, "measure", lambda urls, loads, system, s: dict(cells[next(engine), system.name]))
    assert run.main(["--out", str(fresh), "--real-engine"]) == 0
    reported(fresh)
    assert len(json.loads((fresh / real_engine.RESULTS_FILE).read_text())["runs"]) == len(cells)


def test_chaos(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = {r["system"]: r for r in committed(chaos.RESULTS_FILE)["runs"]}
    monkeypatch.setattr(chaos, "run_system", lambda system, root: (cells[system.name], []))
    assert run.main(["--out", str(fresh), "--chaos"]) == 0
    reported(fresh)
    assert {r["system"] for r in (chaos.load(fresh) or {})["runs"]} == set(cells)
    assert (fresh / chaos.REQUESTS_FILE).exists()


def test_sizing(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = {w["workload"]["name"]: w for w in committed(sizing.RESULTS)["workloads"]}
    monkeypatch.setattr(sizing, "measure", lambda w: cells[w.name])
    assert run.main(["--out", str(fresh), "--sizing"]) == 0
    reported(fresh)
    assert [w["workload"]["name"] for w in (sizing.load(fresh) or {})["workloads"]] == list(cells)


def test_report_only_of_a_fresh_directory_says_what_to_do(fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run.main(["--out", str(fresh), "--report-only"])
    assert exited.value.code == 2
    assert "results.json does not exist; measure into --out" in capsys.readouterr().err
    assert not fresh.exists()
