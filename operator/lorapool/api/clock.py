"""RFC 3339 timestamps as lorapool writes them on the API objects: UTC, whole seconds, ``Z``. Pure.

The one formatter and parser for every ``...Time`` / ``...At`` field the operator, the sidecar
and the tooling write (``2026-12-04T02:04:46Z``). It never reads the clock: callers pass the
Unix seconds they read once (the reconcile takes one ``now`` per pass).
"""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(ts: float) -> str:
    """Unix seconds -> ``YYYY-MM-DDTHH:MM:SSZ`` (UTC, fractions dropped)."""
    return datetime.fromtimestamp(ts, UTC).strftime(FORMAT)


def unix(text: str) -> float:
    """``YYYY-MM-DDTHH:MM:SSZ`` -> Unix seconds; ValueError when ``text`` is not in that form."""
    return datetime.strptime(text, FORMAT).replace(tzinfo=UTC).timestamp()
