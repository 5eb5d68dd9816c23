"""The bad-input corpus (tests/corpus/cases.yaml) at the API server and at the operator.

At `kubectl apply` (server-side dry run: validation without storing) the CRD's schema and CEL
rules refuse what they can, naming the field, in the corpus's words and never with a regular
expression; the rest is accepted and the operator, which reads sources and knows the models,
says what is wrong in a condition. tests/corpus/test_corpus.py runs the same cases at the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.corpus.corpus import CASES, Case, regex_in

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def dry_run_ns(local_cluster: LocalCluster, operator_env: Path) -> Iterator[str]:
    local_cluster.kubectl("create", "namespace", "corpus")
    yield "corpus"
    local_cluster.kubectl("delete", "namespace", "corpus", "--wait=false", check=False)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_server_refuses_at_apply_in_the_corpus_words(
    local_cluster: LocalCluster, dry_run_ns: str, case: Case, tmp_path: Path
) -> None:
    result = local_cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input_text=case.yaml(dry_run_ns, tmp_path), check=False
    )
    if not case.refused_at_apply:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0, result.stdout
    assert case.apiserver in result.stderr, result.stderr
    assert (case.apiserver_field or case.field) in result.stderr, result.stderr
    assert regex_in(result.stderr) == [], result.stderr


OPERATOR_CASES = [c for c in CASES if c.operator]


def _messages(obj: dict[str, Any] | None) -> list[str]:
    status = (obj or {}).get("status") or {}
    return [c.get("message", "") for c in status.get("conditions") or []] + [
        a.get("message") or "" for a in status.get("adapters") or []
    ]


@pytest.mark.parametrize("case", OPERATOR_CASES, ids=[c.id for c in OPERATOR_CASES])
def test_operator_says_what_only_it_can_judge(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, case: Case, tmp_path: Path
) -> None:
    local_cluster.kubectl("apply", "-f", "-", input_text=case.yaml(ns, tmp_path))
    kind, name = ("lorapool", "llama3-8b") if case.operator == "pool" else ("loraadapter", "legal")

    def said() -> str | None:
        import json

        result = local_cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        obj = json.loads(result.stdout) if result.returncode == 0 else None
        return next((m for m in _messages(obj) if case.says in m and case.field in m), None)

    message = wait_until(f"{kind}/{name} says {case.says!r}", said, 60)
    assert regex_in(message) == [], message
