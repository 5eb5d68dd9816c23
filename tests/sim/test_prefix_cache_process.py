"""The prefix cache through a real ``lorapool sim`` process: usage's ``cached_tokens``, the counters,
and a hot swap of an adapter from a new path that misses (from the same path it hits, as vLLM)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lorapool_dev.testing.scrape import metric_value
from tests.sim.conftest import Sim, StartSim

LOAD = "/v1/load_lora_adapter"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 9  # 405 characters: 102 tokens, 6 full blocks
HIT = (102 - 1) // 16 * 16  # every full block but what the last token needs: 96


@pytest.fixture(scope="module")
def sim(start_sim: StartSim, adapters: Callable[..., Path]) -> Sim:
    return start_sim(
        "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--time-scale", "0",
        "--enable-prompt-tokens-details", "--lora-modules", f"swap={adapters('swap-v1', rank=8)}",
    )  # fmt: skip


def cached(sim: Sim, model: str, prompt: str = PROMPT) -> int:
    status, body = sim.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 2})
    assert status == 200, body
    details = body["usage"]["prompt_tokens_details"]
    assert set(details) == {"cached_tokens", "created_cache_tokens", "multimodal_tokens"}
    assert (details["created_cache_tokens"], details["multimodal_tokens"]) == (None, None)  # completions: as vLLM
    return int(details["cached_tokens"])


def test_repeats_hit_and_a_hot_swap_from_a_new_path_misses(sim: Sim, adapters: Callable[..., Path]) -> None:
    base = sim.client().models.list().data[0].id
    before = sim.metrics()
    assert [cached(sim, base), cached(sim, base)] == [0, HIT]
    assert [cached(sim, "swap"), cached(sim, "swap")] == [0, HIT]  # the base's blocks are not the adapter's
    new_path = adapters("swap-v2", rank=8, seed=1)
    for expected in (0, HIT):  # reloaded from a new path: a miss; again from that path: a hit (stale, as vLLM)
        assert sim.post(LOAD, {"lora_name": "swap", "lora_path": str(new_path), "load_inplace": True})[0] == 200
        assert cached(sim, "swap") == expected
    after = sim.metrics()

    def grew(name: str) -> float:
        return metric_value(after, name) - metric_value(before, name)

    assert grew("vllm:prefix_cache_queries_total") == 6 * 102
    assert grew("vllm:prefix_cache_hits_total") == grew("vllm:prompt_tokens_cached_total") == 3 * HIT


def stream_chat(sim: Sim, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    status, text = sim.request("POST", "/v1/chat/completions", body)
    assert status == 200, text
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]
    usage: dict[str, Any] = json.loads(events[-2])["usage"]  # the last chunk before [DONE]
    return usage


def test_a_conversation_resending_its_history_hits_its_first_turn(sim: Sim) -> None:
    first = [{"role": "system", "content": "Answer in SQL. " * 20}, {"role": "user", "content": "List tables."}]
    one = stream_chat(sim, first)
    two = stream_chat(sim, [*first, {"role": "assistant", "content": "SHOW TABLES;"}, {"role": "user", "content": "?"}])
    full_blocks = one["prompt_tokens"] // 16 * 16
    # the streamed usage chunk leaves out nulls, as vLLM's; chat reports the tokens it cached
    assert one["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": full_blocks}
    assert two["prompt_tokens_details"]["cached_tokens"] == full_blocks
