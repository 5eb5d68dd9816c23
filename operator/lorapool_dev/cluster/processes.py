"""Process supervision for the local control plane: start a component binary detached from the
caller's terminal with its output in a log, tell whether it still runs, stop it.

Called by `runtime.LocalCluster` (start, restart, stop) and `state` (the pids `cluster.json`
keeps, so `down` can stop what an earlier `up` left running); `health` reads liveness and log
tails while it waits. Shell: subprocesses, signals, /proc.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapool_dev.cluster.netns import Netns
from lorapool_dev.cluster.versions import binary
from lorapool_dev.testing.wait import WaitTimeout, wait_until

log = logging.getLogger("lorapool_dev.cluster")


@dataclass
class Process:
    """One running component: its pid, the binary it runs and its log (``popen`` when this Python
    process started it; None when read back from `cluster.json`)."""

    name: str
    pid: int
    binary: str
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False  # exited; waiting for its parent (init, once `up` returned) to reap it
        # Guards against a recycled pid: only our binary counts as ours.
        return cmdline.split(b"\0", 1)[0].decode(errors="replace") == self.binary

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def to_state(self) -> dict[str, Any]:
        """What `cluster.json` keeps of it (see ``from_state``)."""
        return {"pid": self.pid, "binary": self.binary, "log": str(self.log)}

    @classmethod
    def from_state(cls, name: str, entry: dict[str, Any]) -> Process:
        """A process an earlier `up` started, from its `cluster.json` entry."""
        return cls(name, entry["pid"], entry["binary"], Path(entry["log"]))


def spawn(name: str, args: list[str], cwd: Path, log_path: Path, preexec: Callable[[], None] | None) -> Process:
    """Start the cached binary of component ``name`` with ``args``, output appended to ``log_path``."""
    exe = str(binary(name))
    with log_path.open("ab") as out:
        # A new session: a Ctrl-C meant for the caller does not reach the control plane;
        # `stop()` / `down` end it by pid.
        popen = subprocess.Popen(
            [exe, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            preexec_fn=preexec,
        )
    log.info("Started %s pid=%d log=%s", name, popen.pid, log_path)
    return Process(name, popen.pid, exe, log_path, popen)


def child_setup(netns: Netns | None, detach: bool) -> Callable[[], None] | None:
    """What a component's child runs before exec: join the namespace, die with us (unless detached)."""
    steps = [*([netns.enter] if netns else []), *([] if detach else [die_with_parent])]
    if not steps:
        return None

    def run() -> None:
        for step in steps:
            step()

    return run


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG).

    KILL, not TERM: all components get it at once, and kube-apiserver's graceful shutdown
    hangs once etcd is gone; the state is disposable anyway."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def terminate(proc: Process, grace_s: float = 10.0) -> None:
    """SIGTERM, ``grace_s`` to exit, then SIGKILL; reaps it when this process started it."""
    if not proc.alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(WaitTimeout):
        wait_until(f"{proc.name} to exit", lambda: not proc.alive(), grace_s)
    if proc.alive():
        log.warning("Killed %s pid=%d reason=%s", proc.name, proc.pid, "no exit after SIGTERM")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    if proc.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)
    log.info("Stopped %s pid=%d", proc.name, proc.pid)
