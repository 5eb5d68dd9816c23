"""How many requests each adapter got, as a router replica counted them over one window. Pure data.

The engines cannot say it: vLLM's metrics carry no per-adapter request counter, and
``vllm:lora_requests_info`` lists which adapters are in flight, not how many requests each has
(a hot adapter with 20 requests in flight looks like a rare one with 1). Every request passes
a router, so each router replica counts them per adapter and writes its last closed window on
its own Pod, in one patch of the ``status`` subresource (as the sidecars write theirs,
``api/report.py``):

- the annotation ``lorapool.io/requests``: compact JSON ``{"v": 1, "w": window seconds,
  "t": Unix seconds when the window closed, "c": {adapter: requests}, "o": requests for
  adapters beyond the ``MAX_ADAPTERS`` busiest, summed}``. Base-model requests are not counted.

The operator sums the fresh windows of its pool's router pods into each adapter's request
rate, the load placement's ``next_k`` sizes k from (docs/placement.md). One write per router
pod per window, never one per request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ANNOTATION = "lorapool.io/requests"
VERSION = 1
MAX_ADAPTERS = 2_000  # ~75 B each: the busiest 2,000 fit the 256 KiB annotation budget with room


@dataclass(frozen=True)
class RequestWindow:
    """One router replica's request counts over one closed window."""

    window_s: float
    end: float  # Unix seconds when the window closed
    counts: Mapping[str, int] = field(default_factory=dict)
    other: int = 0  # requests for adapters cut from ``counts`` (beyond the MAX_ADAPTERS busiest)

    def rate(self, adapter: str) -> float:
        """The adapter's requests per second over the window (0 when not counted)."""
        return self.counts.get(adapter, 0) / self.window_s if self.window_s > 0 else 0.0

    @property
    def total(self) -> int:
        return sum(self.counts.values()) + self.other


def encode(w: RequestWindow, max_adapters: int = MAX_ADAPTERS) -> str:
    """The annotation's value: the busiest ``max_adapters`` by name, the rest summed in ``o``."""
    kept = sorted(w.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_adapters]
    cut = sum(w.counts.values()) - sum(n for _, n in kept)
    doc: dict[str, Any] = {
        "v": VERSION,
        "w": round(float(w.window_s), 3),
        "t": round(float(w.end), 3),
        "c": dict(sorted((name, n) for name, n in kept if n > 0)),
        "o": w.other + cut,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode(text: str | None) -> RequestWindow | None:
    """The window in an annotation, or None when absent or unreadable (a newer or broken writer)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            return None
        window_s, end = float(doc["w"]), float(doc["t"])
        counts = {str(name): int(n) for name, n in (doc.get("c") or {}).items()}
        other = int(doc.get("o", 0))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if window_s <= 0 or other < 0 or any(n < 0 for n in counts.values()):
        return None
    return RequestWindow(window_s=window_s, end=end, counts=counts, other=other)


def pod_requests(pod: Mapping[str, Any]) -> RequestWindow | None:
    """The window on a Pod object (as the API server returns it)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return decode(annotations.get(ANNOTATION))
