"""results.json, the benchmark's one file of cells: started, read, merged and written here.

Every mode of ``bench/run.py`` folds what it measured into OUT/results.json and rewrites RESULTS.md
from it, so a mode run into a fresh ``--out`` directory must start from an empty file rather than
fail after its cells ran (the run would be lost). ``empty`` and ``merge`` are pure; ``load`` and
``save`` are the file's only readers and writers; ``runs_by_scenario`` and ``across`` are how every
report reads its cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = "results.json"


def empty(stamp: dict[str, str]) -> dict[str, Any]:
    """A results file with no cell yet, dated by the run that starts it."""
    return {**stamp, "scenarios": [], "runs": [], "overhead": None}


def path(out: Path) -> Path:
    return out / RESULTS


def load(out: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """OUT/results.json, or an empty one dated ``stamp`` when OUT has none yet."""
    file = path(out)
    return json.loads(file.read_text()) if file.exists() else empty(stamp)


def save(out: Path, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path(out).write_text(json.dumps(data, indent=1, default=str))


def merge(data: dict[str, Any], fresh: dict[str, Any], stamp: dict[str, str]) -> dict[str, Any]:
    """Fold ``fresh`` cells into ``data``: a (scenario, system) cell measured again replaces the old one.

    ``sessions`` lists every run whose cells the file holds (the file's own first run included), once each."""
    sessions = data.setdefault("sessions", [])
    for session in ({k: data[k] for k in ("date", "command", "machine")}, stamp):
        if not any(s["date"] == session["date"] and s["command"] == session["command"] for s in sessions):
            sessions.append(session)
    by_key = {(r["scenario"], r["system"]): i for i, r in enumerate(data["runs"])}
    for run in fresh["runs"]:
        key = (run["scenario"], run["system"])
        if key in by_key:
            data["runs"][by_key[key]] = run
        else:
            data["runs"].append(run)
    known = {s["name"] for s in data["scenarios"]}
    data["scenarios"] += [s for s in fresh["scenarios"] if s["name"] not in known]
    return data


def runs_by_scenario(data: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """scenario -> system -> run, errors left out."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in data.get("runs", []):
        if "error" not in run:  # a cell without a date is from the run that wrote results.json
            out.setdefault(run["scenario"], {})[run["system"]] = {"date": data.get("date"), **run}
    return out


def across(a: dict[str, Any], b: dict[str, Any]) -> str:
    """A label suffix when two cells come from different runs (their dates), else ""."""
    da, db = str(a.get("date")), str(b.get("date"))
    if da == db:
        return ""
    if da[:10] == db[:10]:  # same day: the times say it
        da, db = da[11:], db[11:]
    return f" [runs of {da} and {db}]"
