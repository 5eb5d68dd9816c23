"""What a router says of its shared books (issue 43), on its own Pod for the operator to read. Pure.

A router run with ``--shared-state`` keeps its books (the requests it bound and holds, per backend
and adapter; its demand on rate-limited adapters) in a Redis-protocol store beside the other
routers' and reads theirs from it. It writes the annotation ``lorapool.io/shared-books`` on its Pod
when the store's state changes (reachable or not, how many peers it sees), which the operator
reads into the pool's ``SharedBooks`` condition. A router without ``--shared-state`` writes none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ANNOTATION = "lorapool.io/shared-books"
STATE_VERSION = 1
MAX_ERROR = 300


@dataclass(frozen=True)
class BooksState:
    """One router's view of the shared store."""

    up: bool  # the last write to the store succeeded within its deadline
    peers: int = 0  # other routers whose books it reads now (live on the store's clock)
    error: str = ""  # why the store is unreachable (no credentials in it), when not up
    since: float = 0.0  # Unix time of the last change of ``up``


def encode_state(state: BooksState) -> str:
    """The annotation's value (compact JSON)."""
    doc: dict[str, Any] = {"v": STATE_VERSION, "up": state.up, "peers": state.peers, "since": round(state.since, 3)}
    if state.error:
        doc["error"] = state.error[:MAX_ERROR]
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode_state(text: str | None) -> BooksState | None:
    """The state in an annotation, or None when absent or unreadable (an older or newer router)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("v") != STATE_VERSION or not isinstance(doc.get("up"), bool):
        return None
    peers, since, error = doc.get("peers", 0), doc.get("since", 0.0), doc.get("error", "")
    if not isinstance(peers, int) or not isinstance(since, int | float) or not isinstance(error, str):
        return None
    return BooksState(doc["up"], max(0, peers), error[:MAX_ERROR], float(since))
