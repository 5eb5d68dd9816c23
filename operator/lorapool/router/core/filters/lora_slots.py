"""Keep backends that can run the adapter without exceeding their LoRA slots (the grouping rule).

vLLM admits a request only when its adapter is already in the running batch or fewer than
``max_loras`` adapters run; anything else waits inside the engine, out of order, and a slot
change stalls the whole batch. Keeps: backends where the adapter is already in flight or fewer
than ``max_loras`` distinct adapters are in flight; every backend for a base-model request.
Reads: ``active``, ``max_loras``, ``model``, ``is_adapter``. An empty result is not an error:
admission holds the request (``Hold(slot)``) in the adapter's wait queue and binds it when a
slot frees (or best-effort after a bounded wait).
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import FilterPlugin


def lora_slots(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
    """Backends where the request fits in the LoRA slots; base-model requests always fit."""
    return [b for b in backends if b.fits(req)]


PLUGIN = FilterPlugin("lora-slots", lambda _params: lora_slots, reads=("active", "max_loras", "model", "is_adapter"))
