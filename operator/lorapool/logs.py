"""Kubernetes-style (klog text) log lines for every lorapool process:
``I1202 12:00:00.123456 1 agent.py:88] "Loaded adapter" adapter="sql"``.

One format for the operator, router, sidecar, simulator and local cluster, so one grep or log
pipeline reads them all. Callers pass structured fields as ``extra={"kv": {...}}`` or as plain
``extra={"adapter": "sql"}`` attributes; values are JSON-quoted. Nothing here redacts: callers
only ever log redacted URLs and never tokens.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

_LEVELS = {"DEBUG": "I", "INFO": "I", "WARNING": "W", "ERROR": "E", "CRITICAL": "E"}
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "kv", "taskName"}
# kopf's per-object logger context: an OperatorSettings object and posting flags, not fields
_KOPF_CONTEXT = frozenset({"settings", "k8s_skip", "k8s_ref"})


class KlogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).strftime("%m%d %H:%M:%S.%f")
        head = f"{_LEVELS.get(record.levelname, 'I')}{ts} {os.getpid()} {record.filename}:{record.lineno}]"
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k not in _KOPF_CONTEXT}
        fields.update(getattr(record, "kv", None) or {})
        parts = [json.dumps(record.getMessage())]
        parts += [f"{k}={json.dumps(v, default=str)}" for k, v in fields.items() if v is not None]
        line = f"{head} {' '.join(parts)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class WatchSuccessFilter(logging.Filter):
    """Drops kopf's INFO line "Handler '...' succeeded." that follows every watch event: the operator's
    handlers only queue a pool, and at 10,000 adapters those lines were 98 % of its log. Failures and
    DEBUG logging keep them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not record.name.startswith("kopf"):
            return True
        message = record.getMessage()
        return not (message.startswith("Handler '") and message.endswith("' succeeded."))


def setup(level: str = "INFO") -> None:
    """Route every logger through one klog handler at ``level`` and quieten chatty libraries."""
    handler = logging.StreamHandler()
    handler.setFormatter(KlogFormatter())
    if level.upper() != "DEBUG":
        handler.addFilter(WatchSuccessFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "botocore", "urllib3", "huggingface_hub", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
