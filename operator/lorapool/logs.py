"""Kubernetes-style (klog text) log lines: ``I1202 12:00:00.123456 1 agent.py:88] "Loaded adapter" adapter="sql"``.

Callers pass structured fields with ``extra={"kv": {...}}``; values are quoted. Nothing
here redacts: callers only ever log redacted URLs and never tokens.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

_LEVELS = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "E"}


class KlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).strftime("%m%d %H:%M:%S.%f")
        head = f"{_LEVELS.get(record.levelname, 'I')}{ts} {os.getpid()} {record.filename}:{record.lineno}]"
        fields = getattr(record, "kv", None) or {}
        parts = [json.dumps(record.getMessage())]
        parts += [f"{k}={json.dumps(v, default=str)}" for k, v in fields.items() if v is not None]
        line = f"{head} {' '.join(parts)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "botocore", "urllib3", "huggingface_hub", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
