"""Run a real server process for a test and wait until its health URL answers.

Generic on purpose: the simulator, sidecar and router tests all start their component the way
a user would (``python -m lorapool.cli sim --port ...``) and talk to it over loopback.

    with start_process([sys.executable, "-m", "lorapool.cli", "sim", "--port", str(port)],
                       f"http://127.0.0.1:{port}/health") as proc:
        ...  # proc.output() has everything the process printed so far

Output goes to a temporary file, not a pipe, so a chatty process never blocks on a full pipe.
A process that exits early or never becomes healthy raises ``ProcessError`` with its output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from lorapool_dev.testing.wait import WaitTimeout, wait_until

_OUTPUT_TAIL_CHARS = 4000


class ProcessError(RuntimeError):
    """A started process died or did not become healthy in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process may still take it first)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports: the kernel hands them out while all are held at once."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def descendants(root: int) -> list[int]:
    """Pids of the live (not zombie) processes below ``root``, from /proc, parents before children.

    A server may fork workers that outlive it (vLLM's engine core); stopping or checking for
    leaks has to see the whole tree."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22); None when gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def kill_all(tree: Sequence[tuple[int, str | None]]) -> None:
    """SIGKILL each (pid, start time) still alive. The start time tells a survivor from a new process
    the kernel has since given the same number, which is left alone."""
    for pid, started in tree:
        if started is not None and start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class RunningProcess:
    """A process started by ``start_process``; a context manager that stops it on exit."""

    def __init__(self, args: Sequence[str], popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.args = tuple(args)
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit code. Idempotent."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return self.popen.returncode

    def close(self) -> None:
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> RunningProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _tail(self) -> str:
        text = self.output()
        return text[-_OUTPUT_TAIL_CHARS:] if text else "(no output)"


def start_process(
    cmd: Sequence[str],
    health_url: str,
    timeout: float = 30.0,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> RunningProcess:
    """Start ``cmd`` and return once ``GET health_url`` answers 200.

    ``env`` is added to (not substituted for) the current environment. Raises ProcessError,
    with the process's output, when it exits first or ``timeout`` seconds pass.
    """
    full_env = {**os.environ, **(env or {})}
    fd, name = tempfile.mkstemp(prefix="lorapool-proc-", suffix=".log")
    log_path = Path(name)
    with os.fdopen(fd, "wb") as log:
        popen = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, cwd=cwd
        )
    proc = RunningProcess(cmd, popen, log_path)

    def healthy() -> bool:
        code = popen.poll()
        if code is not None:  # not retried: report the exit with the process's own words
            tail = proc._tail()
            proc.close()
            raise ProcessError(f"{' '.join(cmd)} exited with code {code} before {health_url} answered:\n{tail}")
        return _healthy(health_url)

    try:
        wait_until(f"{health_url} to answer 200", healthy, timeout, interval_s=0.05, max_interval_s=0.2)
    except WaitTimeout:
        proc.stop()
        tail = proc._tail()
        proc.close()
        raise ProcessError(f"{' '.join(cmd)}: {health_url} did not answer 200 within {timeout} s:\n{tail}") from None
    return proc


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
