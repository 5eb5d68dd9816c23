"""A background thread that keeps a local stand-in in line with the API by polling.

The playground's stand-ins for what a kubelet does (projecting a ConfigMap, running a pod's
containers) poll the API server every ``period_s``; each must sync once before it returns
from ``start`` (so what it makes exists when the caller goes on), survive an API server that
is restarting, and be joined when stopped (the test leak check fails on a thread left behind).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any, Self

log = logging.getLogger("lorapool_dev.testing.follow")


class Follower:
    """Runs ``sync_once`` at start and then every ``period_s`` until ``stop``."""

    join_timeout_s = 10.0

    def __init__(self, what: str, period_s: float) -> None:
        self.what = what
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> Any:
        raise NotImplementedError

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> Self:
        """Sync once now (errors reach the caller), then follow from a daemon thread."""
        self._stop.clear()
        self.sync_once()
        self._thread = threading.Thread(target=self._follow, name=self.what, daemon=True)
        self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sync_once()
            except Exception as exc:  # the API may be restarting; the next period retries
                log.warning("Failed to follow %s: %s", self.what, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout_s)
            self._thread = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
