"""lorapool_dev.engine.lora_cache without running vLLM: its log lines and list_loras answers, as 0.32 writes them."""

from __future__ import annotations

from typing import Any

import pytest

from lorapool_dev.engine.lora_cache import LoraEvent, LoraEventKind, cached_ids_of, lora_events

# Copied from a CPU-build vLLM 0.32 run with INSPECT_ENV: the re-load of an unloaded adapter.
RELOAD_LOG = """\
(Worker pid=21177) DEBUG 12-04 21:23:56 [lora/model_manager.py:1383] Adding lora. Model id: 3, int id: 3
(Worker pid=21177) DEBUG 12-04 21:23:56 [lora/model_manager.py:68] Removing adapter int id: 1
(Worker pid=21177) DEBUG 12-04 21:23:56 [lora/model_manager.py:366] Activating LoRA. int id: 3, slot index: 0
(Worker pid=21177) DEBUG 12-04 21:23:56 [lora/model_manager.py:384] No LoRA weights found for module lm_head, skipping.
(APIServer pid=20806) INFO 12-04 21:23:56 [entrypoints/.../models/serving.py:226] Loaded new LoRA adapter: name 'a', path '/tmp/a'
(APIServer pid=20806) INFO 12-04 21:23:56 [entrypoints/.../models/serving.py:244] Removed LoRA adapter: name 'a'
"""


def test_lora_events_reads_reads_activations_and_removals_in_order() -> None:
    assert lora_events(RELOAD_LOG) == [
        LoraEvent(LoraEventKind.READ, 3),
        LoraEvent(LoraEventKind.REMOVED, 1),
        LoraEvent(LoraEventKind.ACTIVATED, 3, slot=0),
    ]
    assert [str(e) for e in lora_events(RELOAD_LOG)] == ["read 3", "removed 1", "activated 3 slot 0"]


def test_the_serving_layers_unload_line_is_no_cache_event() -> None:
    assert lora_events("(APIServer pid=1) INFO 12-04 21:23:56 [serving.py:244] Removed LoRA adapter: name 'a'\n") == []


CACHED: dict[str, tuple[Any, set[int]]] = {
    "one-worker": ({"results": [[1, 3]]}, {1, 3}),
    "empty-cache": ({"results": [[]]}, set()),
    "two-workers-union": ({"results": [[1], [1, 2]]}, {1, 2}),
}


@pytest.mark.parametrize(("body", "ids"), list(CACHED.values()), ids=list(CACHED))
def test_cached_ids_of(body: Any, ids: set[int]) -> None:
    assert cached_ids_of(body) == ids


@pytest.mark.parametrize("body", [{"results": "{1, 3}"}, {"error": "x"}, [1, 3]], ids=["text", "no-results", "list"])
def test_cached_ids_of_refuses_another_shape_naming_it(body: Any) -> None:
    with pytest.raises(ValueError, match="list_loras answered"):
        cached_ids_of(body)
