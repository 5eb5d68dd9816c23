"""The cache outside the repository (``$LORAPOOL_CACHE``, default ``~/.cache/lorapool``) that the
control-plane build, the engine install and the image build share, and the lock each holds while
it fills its part: clones share one cache, and two builds at once would only compete for the same
cores and RAM (the second waits, then finds the work done)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


def cache_root() -> Path:
    """`$LORAPOOL_CACHE` or `~/.cache/lorapool`: outside the repo so clones share one build."""
    return Path(os.environ.get("LORAPOOL_CACHE") or Path.home() / ".cache" / "lorapool")


@contextlib.contextmanager
def exclusive(path: Path, waiting: Callable[[str], None]) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (made with its parents when missing), with this pid
    written in it; when another process holds it, call ``waiting`` with that holder, then block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            waiting(handle.read().strip() or "?")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid={os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
