"""docs/status.md says what the code does: its names, phases and example report are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

from lorapool.api.report import ANNOTATION, SYNCED_CONDITION, ReplicaPhase, decode
from lorapool.api.status import AdapterPhase, ConditionType
from lorapool.controller.status import FAILED_REASONS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "status.md").read_text()


def test_names_and_vocabularies_in_the_doc_are_the_codes() -> None:
    assert f"`{ANNOTATION}`" in DOC and f"`{SYNCED_CONDITION}`" in DOC
    table = {m for m in re.findall(r"^\| (\w+) \|", DOC, re.M)}
    assert {p.value for p in AdapterPhase} <= table, "every pool/adapter phase has a row"
    assert all(p.value in DOC for p in ReplicaPhase)
    assert all(f"**{t}**" in DOC for t in (ConditionType.ACCEPTED, ConditionType.READY, ConditionType.DEGRADED))
    assert all(f"`{r}`" in DOC for r in FAILED_REASONS)


def test_the_example_report_decodes() -> None:
    example = re.search(r"```json\n(.*?)```", DOC, re.S)
    assert example is not None
    report = decode("".join(line.strip() for line in example.group(1).splitlines()))
    assert report is not None and report.engine_healthy
    sql = report.adapters["sql-coder"]
    assert sql.loaded == sql.id and report.adapters["wide"].phase == ReplicaPhase.FAILED
    assert report.adapters["legal"].loaded not in (None, report.adapters["legal"].id)
