"""`lorapool plan|render|crds` as a user runs them: real subprocesses, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lorapool.yaml"


def lorapool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lorapool.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_plan_table_explains_each_flag() -> None:
    result = lorapool("plan", "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    for needle in ("--max-loras", "--max-lora-rank 16", "--max-cpu-loras", "KV cache", "naive --max-lora-rank 256"):
        assert needle in result.stdout


def test_plan_json_has_the_status_names() -> None:
    result = lorapool("plan", "-f", str(EXAMPLE), "-o", "json")
    data = json.loads(result.stdout)
    assert data["maxLoraRank"] == 16 and data["maxLoras"] >= 2 and data["maxCpuLoras"] >= data["maxLoras"]
    assert {"weightsBytes", "loraBytes", "reserveBytes", "kvCacheBytes", "kvCacheTokens"} <= set(data["memory"])
    assert set(data["reasons"]) == {"maxLoras", "maxLoraRank", "maxCpuLoras"}


def test_render_prints_every_child_object() -> None:
    result = lorapool("render", "-f", "-", stdin=EXAMPLE.read_text())
    kinds = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(result.stdout)]
    assert ("Deployment", "llama3-8b-engine") in kinds and ("Service", "llama3-8b") in kinds
    assert ("ConfigMap", "llama3-8b-adapters") in kinds and ("Deployment", "llama3-8b-router") in kinds


def test_render_places_a_catalog_larger_than_the_cpu_cache_as_the_operator_does() -> None:
    doc = _example()
    doc["spec"]["replicas"] = 4
    doc["spec"]["lora"] = {"maxLoras": 2, "maxCpuLoras": 2}
    doc["spec"]["adapters"] = [{"name": f"team-{i}", "source": f"hf://acme/team-{i}", "rank": 16} for i in range(6)]
    result = lorapool("render", "-f", "-", stdin=yaml.safe_dump(doc))
    assert result.returncode == 0, result.stderr
    cm = next(d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "ConfigMap")
    slots = {a["name"]: a["replicas"] for a in json.loads(cm["data"]["adapters.json"])["adapters"]}
    assert sorted(slots) == [f"team-{i}" for i in range(6)] and {len(s) for s in slots.values()} == {1}
    per_slot = [sum(1 for s in slots.values() if i in s) for i in range(4)]
    assert max(per_slot) <= 2  # never more than maxCpuLoras on a replica


def test_crds_writes_files(tmp_path: Path) -> None:
    assert lorapool("crds", "--out", str(tmp_path)).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lorapool.io_loraadapters.yaml", "lorapool.io_lorapools.yaml"]


def _example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def _with(mutate: Any) -> str:
    doc = _example()
    mutate(doc)
    return yaml.safe_dump(doc)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["spec"]["adapters"][0].update(rank=600), "spec.adapters[0].rank"),
        (lambda d: d["spec"]["lora"].update(maxLoras=8, maxCpuLoras=4), "maxCpuLoras=4 is below maxLoras=8"),
        (lambda d: d["spec"]["adapters"][1].update(name="sql-coder"), "names must be unique"),
        (lambda d: d["spec"]["gpu"].update(product="T4"), "spec.gpu.product"),
        (
            lambda d: d["spec"]["baseModel"].update(
                name="meta-llama/Meta-Llama-3-70B", source="hf://meta-llama/Meta-Llama-3-70B"
            ),
            "set spec.gpu.count to 4",
        ),
        (lambda d: d["spec"]["lora"].update(maxLoraRank=8), "maxLoraRank=8 is below"),
        (lambda d: d.update(kind="Pool"), "no LoRAPool found"),
    ],
    ids=[
        "rank-600",
        "cpu-below-gpu",
        "duplicate-name",
        "unknown-gpu",
        "weights-do-not-fit",
        "rank-below-adapter",
        "not-a-pool",
    ],
)
@pytest.mark.parametrize("command", ["plan", "render"])
def test_bad_input_exits_nonzero_with_one_line_per_problem(command: str, mutate: Any, expected: str) -> None:
    result = lorapool(command, "-f", "-", stdin=_with(mutate))
    assert result.returncode == 1
    assert result.stdout == ""
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert all(line.startswith(("error: ", "lorapool ")) for line in result.stderr.splitlines())


@pytest.mark.parametrize("text", ["{", "- just\n- a list\n", ""], ids=["bad-yaml", "list", "empty"])
def test_unreadable_input_is_a_clear_error(text: str) -> None:
    result = lorapool("plan", "-f", "-", stdin=text)
    assert result.returncode == 1 and "Traceback" not in result.stderr and "error:" in result.stderr


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = lorapool("plan", "-f", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1 and "cannot read" in result.stderr


def test_the_readme_plan_example_is_what_plan_prints() -> None:
    """Each line of the README's `lorapool plan` block (shortened with '...', or wrapped) is in the real output."""
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    block = readme.split("$ lorapool plan -f examples/lorapool.yaml\n", 1)[1].split("```", 1)[0]
    result = lorapool("plan", "-f", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    for line in filter(None, block.splitlines()):
        assert line.removesuffix(" ...").strip() in result.stdout, line


def test_plan_of_one_rank_300_adapter_shows_at_most_two_slots_and_their_price() -> None:
    doc = _example()
    doc["spec"]["adapters"] = [{"name": "wide", "source": "hf://acme/wide-lora", "rank": 300}]
    result = lorapool("plan", "-f", "-", stdin=yaml.safe_dump(doc))
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.strip().startswith("--max-loras"))
    assert int(line.split()[1]) <= 2, line
    assert "% of the KV cache" in line and "GB" in line, line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--status-write-qps", "0"], "--status-write-qps: 0 is not above 0"),
        (["--status-write-burst", "-1"], "--status-write-burst: -1 is not above 0"),
        (["--status-write-qps", "fast"], "--status-write-qps: 'fast' is not a number"),
    ],
)
def test_the_operators_write_rate_flags_refuse_what_would_never_write(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from lorapool.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser(["operator"]).parse_args(["operator", *argv])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_the_operators_write_rate_flags_are_parsed_as_numbers() -> None:
    from lorapool.cli import build_parser

    args = build_parser(["operator"]).parse_args(
        ["operator", "--status-write-qps", "400", "--status-write-burst", "800"]
    )
    assert (args.status_write_qps, args.status_write_burst) == (400.0, 800)
