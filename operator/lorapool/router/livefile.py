"""A document file the router keeps in force (``--traffic-file``, ``--policy-file``). Shell.

The kubelet swaps a ConfigMap volume's files in place (a symlink flip), so the file is read again
every poll interval and handed on only when its bytes differ from the last ones seen; an
unreadable file keeps what is in force. What a changed file means (parse, apply, or keep the last
good document on a bad edit) is each subclass's ``reread``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path


class LiveFile:
    """``path`` as last seen (``seen``: the bytes in force); ``what`` names the document in logs."""

    def __init__(self, path: Path, seen: bytes, what: str, log: logging.Logger) -> None:
        self.path, self._seen, self._what, self._log = path, seen, what, log

    def changed(self) -> bytes | None:
        """The file's bytes when they changed since last seen, else None (unchanged or unreadable)."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._log.warning(f"Kept the {self._what}: cannot read the file", extra={"kv": {"error": str(exc)}})
            return None
        if data == self._seen:
            return None
        self._seen = data
        return data

    def reread(self) -> bool:
        """Read the file again; True when a changed, valid document was applied."""
        raise NotImplementedError

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.reread()
