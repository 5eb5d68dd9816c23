"""pytest plugin: a test owns what it starts. Threads, processes and listening ports that outlive
their owner fail the run loudly instead of breaking a later test at random.

Why: a client thread left running by a failed test raises when its server stops and pytest
reports it in whichever test runs then; a server process left behind keeps a port and a core.

- Threads: a thread started while a test body runs must be gone when that test's teardown ends
  (waited for briefly). Otherwise the test gets a teardown error naming the thread.
- Processes and ports: at the end of the session, when every fixture is finalised, no process
  descended from pytest may be alive and pytest itself may listen on no TCP port. Leaked
  processes are listed and killed, and the session fails.

Registered by ``tests/conftest.py``. Linux only (reads /proc); elsewhere it checks threads only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from lorapool_dev.testing.processes import descendants
from lorapool_dev.testing.wait import WaitTimeout, wait_until

THREAD_GRACE_S = 5.0
# Process-lifetime daemons that libraries start on first use, not owned by any test:
# tqdm's monitor (huggingface_hub's progress bars) lives until the interpreter exits.
LIBRARY_THREADS = frozenset({"tqdm_monitor"})
_PROC = Path("/proc")
_started_in_call = pytest.StashKey[set[threading.Thread]]()
_baseline = pytest.StashKey[set[int]]()


@dataclass(frozen=True)
class Leak:
    pid: int
    cmdline: str


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    before = set(threading.enumerate())
    try:
        return (yield)
    finally:
        item.stash[_started_in_call] = {
            t for t in threading.enumerate() if t not in before and t.name not in LIBRARY_THREADS
        }


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    result = yield
    _check_threads(item)
    return result


def _check_threads(item: pytest.Item) -> None:
    started = item.stash.get(_started_in_call, set())
    if not started:
        return
    try:
        wait_until("threads the test started to end", lambda: not _alive(started), THREAD_GRACE_S)
    except WaitTimeout:
        names = ", ".join(sorted(t.name for t in _alive(started)))
        pytest.fail(
            f"{item.nodeid} left threads running {THREAD_GRACE_S:g} s after its teardown: {names}; "
            "join the threads a test starts (a ThreadPoolExecutor `with` block does)",
            pytrace=False,
        )


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[_baseline] = set(descendants(os.getpid()))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _PROC.is_dir():
        return
    baseline = session.stash.get(_baseline, set())
    leaked = [p for p in _processes(descendants(os.getpid())) if p.pid not in baseline]
    ports = _listening_ports(os.getpid())
    if not leaked and not ports:
        return
    lines = ["", "LEAKS: the test session left these behind (every fixture was already finalised):"]
    lines += [f"  process {p.pid}: {p.cmdline}" for p in leaked]
    lines += [f"  pytest itself still listens on 127.0.0.1:{port}" for port in ports]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
    for proc in leaked:
        _kill(proc.pid)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _alive(threads: Iterable[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threads if t.is_alive()]


def _processes(pids: Iterable[int]) -> list[Leak]:
    out = []
    for pid in pids:
        try:
            raw = (_PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        out.append(Leak(pid, raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]))
    return out


def _listening_ports(pid: int) -> list[int]:
    """TCP ports the process ``pid`` listens on (an in-process server nobody stopped)."""
    inodes: set[str] = set()
    try:
        for fd in (_PROC / str(pid) / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (_PROC / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
