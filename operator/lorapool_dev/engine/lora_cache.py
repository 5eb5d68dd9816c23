"""What a running vLLM holds in its LoRA caches, read for the tests that measure unload (docs/vllm.md).

vLLM exposes no per-adapter residency (the gauges of vllm #54830 are in review), so
``tests/engine/test_unload_real.py`` reads the two things it does expose when started with
``INSPECT_ENV``:

- its dev-mode ``POST /collective_rpc {"method": "list_loras"}``: the ``lora_int_id`` of every
  adapter in the worker's CPU cache (``--max-cpu-loras`` entries, LRU), named or not;
- its DEBUG log, whose worker lines (``vllm/lora/model_manager.py``) say when an adapter is read
  from disk into the CPU cache, put in a GPU slot (``--max-loras``), or dropped from either cache.

``lora_events`` reads the log (pure); ``fetch_cached_lora_ids`` is the one call. The lines are
0.32's (the CPU build); 0.34 writes the same ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lorapool_dev.testing import http

# Added to ``vllm serve``'s environment: the dev-mode RPC endpoint and the worker's DEBUG lines.
# Tests only: dev mode also opens endpoints that reset caches and reload weights.
INSPECT_ENV: Mapping[str, str] = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "DEBUG"}


class LoraEventKind(StrEnum):
    READ = "read"  # a new LoRAModel entered the CPU cache: its weights were read from the adapter's path
    ACTIVATED = "activated"  # put in a GPU slot (``slot`` says which)
    REMOVED = "removed"  # dropped from the GPU slots or the CPU cache (vLLM writes the same line for both)


@dataclass(frozen=True)
class LoraEvent:
    kind: LoraEventKind
    lora_id: int
    slot: int | None = None

    def __str__(self) -> str:
        where = f" slot {self.slot}" if self.slot is not None else ""
        return f"{self.kind} {self.lora_id}{where}"


_LINES = re.compile(
    r"Adding lora\. Model id: (?P<read>\d+), int id: \d+"
    r"|Activating LoRA\. int id: (?P<activated>\d+), slot index: (?P<slot>\d+)"
    r"|Removing adapter int id: (?P<removed>\d+)"
)


def lora_events(log: str) -> list[LoraEvent]:
    """The LoRA cache events in ``log`` (an engine's output), in order. Pure."""
    events: list[LoraEvent] = []
    for m in _LINES.finditer(log):
        if m["read"] is not None:
            events.append(LoraEvent(LoraEventKind.READ, int(m["read"])))
        elif m["activated"] is not None:
            events.append(LoraEvent(LoraEventKind.ACTIVATED, int(m["activated"]), int(m["slot"])))
        else:
            events.append(LoraEvent(LoraEventKind.REMOVED, int(m["removed"])))
    return events


def cached_ids_of(body: Any) -> set[int]:
    """The ids in a ``list_loras`` answer (``{"results": [[1, 3]]}``: one list per worker). Pure."""
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or not all(isinstance(r, list) for r in results):
        raise ValueError(f"list_loras answered {body!r}: expected {{'results': [[<lora_int_id>, ...], ...]}}")
    return {int(i) for worker in results for i in worker}


def fetch_cached_lora_ids(url: str, *, timeout_s: float = 30.0) -> set[int]:
    """The ``lora_int_id`` of every adapter in the CPU cache of the vLLM at ``url``."""
    resp = http.request(f"{url}/collective_rpc", "POST", {"method": "list_loras"}, timeout_s=timeout_s)
    if resp.status == 404:
        raise RuntimeError(
            f"POST {url}/collective_rpc answered 404: start the engine with lora_cache.INSPECT_ENV "
            "(VLLM_SERVER_DEV_MODE=1)"
        )
    if resp.status != 200:
        raise RuntimeError(f"POST {url}/collective_rpc list_loras answered {resp.status}: {resp.text[:300]}")
    return cached_ids_of(resp.json())
