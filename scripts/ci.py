#!/usr/bin/env python3
"""`make test`'s steps, each timed, ending with the CI budget table (lorapool_dev.testing.tiers).

    python scripts/ci.py                 # lint, control-plane build, engine install, image build, every test
    python scripts/ci.py -- tests/router # the same steps, pytest on a part of the suite

The steps run in order and stop at the first that fails, except pytest, whose tiers are reported
either way. A tier over its budget is named in the table; the exit status is the first failing
step's, so a slow tier never fails the run by itself (the table is where it shows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from lorapool.api.vllm_versions import SUPPORTED  # noqa: E402
from lorapool.cache import cache_root  # noqa: E402
from lorapool_dev.cluster import build  # noqa: E402
from lorapool_dev.cluster.runtime import COMPONENTS  # noqa: E402
from lorapool_dev.engine.install import find_engine  # noqa: E402
from lorapool_dev.engine.parsers import find_parser  # noqa: E402
from lorapool_dev.image.build import images_built  # noqa: E402
from lorapool_dev.peer import EPP  # noqa: E402
from lorapool_dev.testing.tiers import TIERS, TIMES_ENV, Measured, table  # noqa: E402

sys.path.insert(0, str(REPO))
from bench import inference_perf  # noqa: E402


def step(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float]:
    print(f"==> {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    code = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
    return code, time.monotonic() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest, after --")
    pytest_args: list[str] = parser.parse_args(argv).pytest_args
    measured: list[Measured] = []

    def finish(code: int) -> int:
        print("\n".join(table(measured)), flush=True)
        return code

    code, seconds = step(["make", "--no-print-directory", "lint"])
    measured.append(Measured("lint", seconds, cold=False))
    if code:
        return finish(code)
    cold = bool(build.missing(cache_root(), COMPONENTS))
    code, seconds = step([str(REPO / "scripts" / "build-control-plane")])
    measured.append(Measured("control-plane build", seconds, cold=cold))
    if code:
        return finish(code)
    cold = find_engine() is None or any(find_parser(v) is None for v in SUPPORTED)
    code, seconds = step([sys.executable, "-m", "lorapool.cli", "engine", "install"])
    if not code:  # vLLM's own CLI parser per supported release, for the flag contract (on the engine's deps)
        code, parsers_s = step([sys.executable, "-m", "lorapool.cli", "engine", "parsers"])
        seconds += parsers_s
    measured.append(Measured("engine install", seconds, cold=cold))
    if code:
        return finish(code)
    if os.geteuid() == 0:  # buildah and containerd need root; tests/image skips without it
        cold = not images_built()
        code, seconds = step([sys.executable, "-m", "lorapool.cli", "image", "build"])
        measured.append(Measured("image build", seconds, cold=cold))
        if code:
            return finish(code)
    else:
        print("==> lorapool image build: skipped (needs root: buildah, containerd)", flush=True)
    # The benchmark's peer (GIE's endpoint picker, from the Go module proxy) and the field's load
    # generator (inference-perf, in its own Python 3.12 venv): built once into the cache, timed here
    # rather than charged to the first test that needs them.
    cold = not build.is_built(EPP, cache_root()) or not inference_perf.venv_dir().exists()
    code, seconds = step([sys.executable, "-m", "lorapool_dev.peer"])
    if not code:
        code, venv_s = step([sys.executable, "-m", "bench.inference_perf"])
        seconds += venv_s
    measured.append(Measured("peer build", seconds, cold=cold))
    if code:
        return finish(code)
    with tempfile.TemporaryDirectory(prefix="lorapool-tiers-") as tmp:
        times = Path(tmp) / "tiers.json"
        env = {**os.environ, TIMES_ENV: str(times)}
        # --durations: the slowest tests, named in the log, for whoever trims a tier over its budget
        code, wall = step([sys.executable, "-m", "pytest", "-q", "--durations=25", *pytest_args], env=env)
        measured += tier_times(times, wall)
    return finish(code)


def tier_times(times: Path, wall_s: float) -> list[Measured]:
    """The plugin's per-tier sums, in TIERS order; what pytest spent outside tests (collection,
    start-up) is its own line, so the sum is pytest's wall time."""
    if not times.exists():  # pytest died before its session ended
        return [Measured("unit", wall_s, cold=False, detail="pytest wrote no tier times")]
    data = json.loads(times.read_text())
    tiers = data["tiers"]
    rows = [
        Measured(t.name, tiers[t.name]["seconds"], cold=False, detail=f"{tiers[t.name]['tests']} tests")
        for t in TIERS
        if t.name in tiers
    ]
    rows.append(Measured("pytest overhead", max(0.0, wall_s - sum(r.seconds for r in rows)), cold=False,
                         detail="collection, start-up, between tests"))  # fmt: skip
    return rows


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
