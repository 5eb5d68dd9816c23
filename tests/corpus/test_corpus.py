"""The bad-input corpus at the first layer: `lorapool plan` refuses each case offline (exit 1,
nothing on stdout, one `error: <field>: ...` line per problem, a valid example, no regular
expression) or, where only a cluster can judge, accepts it. The API server and the operator
layers run in tests/controller/test_corpus.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.corpus.corpus import CASES, Case, regex_in, set_path


def plan(stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "plan", "-f", "-"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_corpus_is_large_and_every_case_is_refused_somewhere() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    for case in CASES:
        assert case.refused_offline or case.refused_at_apply or case.operator, case.id
        assert not (case.refused_at_apply and case.operator), f"{case.id}: the API server already refuses it"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_refuses_with_one_readable_line_per_problem(case: Case, tmp_path: Path) -> None:
    result = plan(case.yaml(files_dir=tmp_path))
    assert "Traceback" not in result.stderr
    if not case.refused_offline:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 1 and result.stdout == "", result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 + len(case.also), errors
    assert any(case.field in line and case.says in line for line in errors), errors
    for also in case.also:
        assert any(also in line for line in errors), (also, errors)
    assert regex_in(result.stderr) == [], result.stderr


def test_every_problem_of_a_spec_is_reported_at_once() -> None:
    """The mistakes of many cases in one pool: each is named, none hides another."""
    chosen: list[Case] = []
    touched: list[str] = []
    for case in CASES:
        if case.target != "pool" or not (case.refused_offline and case.refused_at_apply) or case.also:
            continue
        if "duplicate" in case.id:
            continue  # another case may rename the adapter it duplicates
        paths = list(case.set)
        if any(p.startswith(t) or t.startswith(p) for p in paths for t in touched):
            continue
        chosen.append(case)
        touched += paths
    assert len(chosen) >= 12, [c.id for c in chosen]
    doc = chosen[0].documents()[0]
    for case in chosen[1:]:
        for path, value in case.set.items():
            set_path(doc, path, value)
    result = plan(yaml.safe_dump(doc))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    for case in chosen:
        assert any(case.field in line and case.says in line for line in errors), (case.id, errors)
    assert len(errors) == len(chosen), errors
