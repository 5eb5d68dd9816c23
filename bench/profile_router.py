"""Where the router's CPU goes: py-spy on the router under the overhead benchmark's load.

    pip install py-spy
    python bench/profile_router.py /tmp/router.raw --rate 500    # record, then summarize
    python bench/profile_router.py /tmp/router.raw --summarize   # summarize a recording again

One ``--time-scale 0`` replica, ``lorapool router --policy affinity`` (plus ``--router-arg``s),
non-streamed 1-token requests open loop; py-spy samples the router process for 10 s and the
summary folds the samples into self and inclusive shares per function (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python bench/profile_router.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Workload, run_open_loop, schedule
from bench.run import ADAPTERS
from bench.systems import FleetSpec, sim_fleet
from lorapool_dev.testing.components import start_router

FRAME = re.compile(r"(.*) \((.*):(\d+)\)")
PREFIX = re.compile(r".*/(site-packages|lib/python3\.\d+|operator)/")


def _name(frame: str) -> str:
    found = FRAME.match(frame)
    if not found:
        return frame
    function, path, _ = found.groups()
    return f"{function} ({PREFIX.sub('', path)})"


def summarize(raw: Path, top: int = 25) -> str:
    """Self and inclusive shares of py-spy's raw (collapsed stack) output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        names = [_name(f) for f in stack.split(";")]
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    lines = [f"{total} samples", "self:"]
    lines += [f"{100 * n / total:5.1f} %  {k}" for k, n in own.most_common(top)]
    lines += ["inclusive:"] + [f"{100 * n / total:5.1f} %  {k}" for k, n in inclusive.most_common(top + 15)]
    return "\n".join(lines)


def record(raw: Path, rate: float, router_args: list[str]) -> None:
    fleet = FleetSpec(replicas=1, adapters=4, max_loras=4, max_cpu_loras=4, time_scale=0)
    work = Workload(rate_rps=rate, duration_s=12, adapters=4, prompt_tokens=(8, 16), output_tokens=(1, 1), seed=11)
    extra = ["--log-level", "WARNING", *router_args]
    adapters = Path(os.environ.get("BENCH_ADAPTERS", ADAPTERS))
    with (
        sim_fleet(fleet, adapters) as sims,
        start_router(sims, policy="affinity", extra=extra, health_path="/health") as router,
    ):
        pid = router.proc.popen.pid
        spy = [
            "py-spy",
            "record",
            "-p",
            str(pid),
            "-d",
            "10",
            "-r",
            "200",
            "-f",
            "raw",
            "-o",
            str(raw),
            "--nonblocking",
        ]
        with subprocess.Popen(spy) as sampler:
            time.sleep(0.5)
            asyncio.run(run_open_loop(router.url, schedule(work), stream=False, drain_timeout_s=30))
            sampler.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, help="py-spy raw output file")
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--router-arg", action="append", default=[], help="extra lorapool router flag (repeat)")
    parser.add_argument("--summarize", action="store_true", help="only summarize an existing recording")
    args = parser.parse_args(argv)
    if not args.summarize:
        record(args.raw, args.rate, args.router_arg)
    print(summarize(args.raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
