"""Regime (g)'s chat sessions (bench/chat.py): each turn resends its history after the adapter's system prompt."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from bench.chat import arrivals, cacheable_fraction, chat_schedule, system_prompt
from bench.loadgen import Planned, Workload, noisy_schedule
from lorapool.sim.text import count_text_tokens

CHAT = Workload(
    rate_rps=20.0, duration_s=60.0, adapters=8, popularity="zipf", prompt_tokens=(5, 20), output_tokens=(4, 12),
    seed=5, turns=4, think_s=3.0, system_prompt_words=50,
)  # fmt: skip


def test_every_turn_begins_with_the_previous_turn_of_its_session() -> None:
    plan = chat_schedule(CHAT)
    assert [p.at_s for p in plan] == sorted(p.at_s for p in plan)
    seen: dict[str, list[str]] = {}
    later_turns = 0
    for p in plan:
        assert p.prompt.startswith(system_prompt(CHAT, p.model) + "\nUser: ")
        assert p.prompt.endswith("\nAssistant:")
        turn = p.prompt.count("\nUser: ")
        assert 1 <= turn <= CHAT.turns
        if turn > 1:  # the turn before it was planned earlier, and is all of this one's start
            assert any(p.prompt.startswith(q + " ") for q in seen.get(p.model, [])), p.prompt[:80]
            later_turns += 1
        seen.setdefault(p.model, []).append(p.prompt)
    assert later_turns > len(plan) / 2  # most requests continue a conversation


def test_adapters_have_their_own_system_prompt_and_the_request_rate_is_kept() -> None:
    plan = chat_schedule(CHAT)
    prompts = {system_prompt(CHAT, p.model) for p in plan}
    assert len(prompts) == len({p.model for p in plan}) > 1
    assert len(system_prompt(CHAT, "lora-0000").split()) == 2 + CHAT.system_prompt_words
    # sessions start at rate / turns, and the last ones are cut at the end: a little under the rate
    assert 0.8 * CHAT.rate_rps <= len(plan) / CHAT.duration_s <= 1.1 * CHAT.rate_rps
    counts = Counter(p.model for p in plan)
    assert counts.most_common(1)[0][1] > 2 * min(counts.values())  # Zipf: some adapters are hot


def test_the_same_seed_gives_the_same_sessions() -> None:
    assert chat_schedule(CHAT) == chat_schedule(CHAT)
    assert chat_schedule(CHAT) != chat_schedule(replace(CHAT, seed=6))


def test_without_turns_arrivals_are_single_requests() -> None:
    single = replace(CHAT, turns=0)
    assert arrivals(single) == noisy_schedule(single)
    with pytest.raises(ValueError, match="turns >= 1"):
        chat_schedule(single)


def test_the_cacheable_bound_counts_whole_blocks_an_earlier_request_of_the_same_adapter_computed() -> None:
    prompt = " ".join(f"w{i}" for i in range(200))
    tokens = count_text_tokens(prompt)
    repeat = [Planned(0.0, "a", prompt, 1), Planned(1.0, "a", prompt, 1)]
    # the second request hits its full blocks but the last token, which is always computed
    assert cacheable_fraction(repeat, 16) == pytest.approx((tokens - 1) // 16 * 16 / (2 * tokens))
    other_adapter = [Planned(0.0, "a", prompt, 1), Planned(1.0, "b", prompt, 1)]
    assert cacheable_fraction(other_adapter, 16) == 0.0  # salted by the adapter, as vLLM's hash is
    assert cacheable_fraction([], 16) == 0.0


def test_the_history_and_the_system_prompt_are_what_is_cacheable() -> None:
    no_system = replace(CHAT, system_prompt_words=0)
    histories = [cacheable_fraction(chat_schedule(replace(no_system, turns=n)), 16) for n in (1, 2, 4, 8)]
    assert histories[0] == 0.0 and histories == sorted(histories) and histories[-1] > 0.5
    assert cacheable_fraction(chat_schedule(replace(CHAT, turns=1)), 16) > 0.5  # the shared system prompt
