"""kill_all: survivors of a process tree are killed, a pid the kernel gave to someone else is not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lorapool_dev.testing.processes import kill_all, start_time

pytestmark = pytest.mark.timeout(30)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_survivor_is_killed_by_the_start_time_it_was_found_with() -> None:
    proc = _sleeper()
    try:
        kill_all([(proc.pid, start_time(proc.pid))])
        assert proc.wait(timeout=10) < 0  # killed by a signal
        assert start_time(proc.pid) is None  # reaped: gone from /proc
    finally:
        proc.kill()


def test_a_pid_with_another_start_time_is_left_alone() -> None:
    proc = _sleeper()
    try:
        started = start_time(proc.pid)
        assert started is not None
        kill_all([(proc.pid, str(int(started) - 1)), (proc.pid, None)])  # a reused number; one already gone
        with pytest.raises(subprocess.TimeoutExpired):  # a SIGKILL would have ended it by now
            proc.wait(timeout=1.0)
    finally:
        proc.kill()
        proc.wait(timeout=10)
