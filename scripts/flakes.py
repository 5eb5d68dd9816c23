#!/usr/bin/env python3
"""Run the test suite N times in a row and report every test that failed at least once.

    make flakes N=5            # five runs of the whole suite
    make flakes N=1 BUSY=1     # one run with every core kept busy by another process
    python scripts/flakes.py --runs 3 --clone -- -m "not cluster"   # from a clean clone of HEAD

A flaky suite blocks landings at random, so flakiness is measured, not guessed: each run writes
a JUnit XML report; the summary lists each test that failed or errored in any run, how often,
and its first message. ``--busy`` starts one CPU-burning process per core for the whole time
(what CI sees when the machine is shared). ``--clone`` runs in a fresh clone of HEAD with
PYTHONPATH pointing at it, as CI does, so uncommitted changes do not count. Exit status is 1
when any test failed in any run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BURN = "while True: pass"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="how many times to run the suite (default 5)")
    parser.add_argument("--busy", action="store_true", help="keep every core busy with another process meanwhile")
    parser.add_argument("--clone", action="store_true", help="run in a fresh clone of HEAD (as CI), not this tree")
    parser.add_argument("--out", type=Path, help="where to keep the JUnit reports and logs (default: a temp dir)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    out = args.out or Path(tempfile.mkdtemp(prefix="lorapool-flakes-"))
    out.mkdir(parents=True, exist_ok=True)
    tree = _clone(out) if args.clone else REPO
    env = {**os.environ, "PYTHONPATH": f"{tree / 'operator'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    burners = [_burner() for _ in range(os.cpu_count() or 1)] if args.busy else []
    failures: dict[str, list[tuple[int, str]]] = defaultdict(list)
    counts: list[tuple[int, int, float]] = []
    try:
        for run in range(1, args.runs + 1):
            report = out / f"run-{run}.xml"
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                   *args.pytest_args]  # fmt: skip
            started = time.monotonic()
            with (out / f"run-{run}.log").open("wb") as log:
                code = subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            seconds = time.monotonic() - started
            tests, failed = _read(report, run, failures)
            if code not in (0, 1) or not report.exists():
                failures[f"(run {run}: pytest itself)"].append((run, f"exit code {code}; see {out}/run-{run}.log"))
            counts.append((tests, failed, seconds))
            print(f"run {run}/{args.runs}: {tests} tests, {failed} failed, exit {code}, {seconds:.0f} s", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    _summarise(failures, args.runs, out)
    return 1 if failures else 0


def _clone(out: Path) -> Path:
    target = out / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(target)], check=True)
    print(f"clean clone of HEAD ({_head(target)}) in {target}", flush=True)
    return target


def _head(tree: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True
    ).stdout.strip()


def _burner() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.DEVNULL)


def _read(report: Path, run: int, failures: dict[str, list[tuple[int, str]]]) -> tuple[int, int]:
    """Count the report's tests and record each failure or error as (run, first line of its message)."""
    if not report.exists():
        return 0, 0
    tests = failed = 0
    for case in ET.parse(report).iter("testcase"):
        tests += 1
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            continue
        failed += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        failures[name].append(
            (run, (problem.get("message") or "").splitlines()[0][:200] if problem.get("message") else "")
        )
    return tests, failed


def _summarise(failures: dict[str, list[tuple[int, str]]], runs: int, out: Path) -> None:
    print()
    if not failures:
        print(f"no test failed in {runs} run(s); reports in {out}")
        return
    print(f"tests that failed at least once in {runs} run(s) (reports in {out}):")
    for name, seen in sorted(failures.items(), key=lambda item: -len(item[1])):
        print(f"  {len(seen)}/{runs}  {name}")
        print(f"        run {seen[0][0]}: {seen[0][1]}")


if __name__ == "__main__":
    sys.exit(main())
