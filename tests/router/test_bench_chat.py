"""Regime (g)'s chat sessions (bench/chat.py): each turn resends its history after the adapter's system prompt."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from bench.chat import arrivals, chat_schedule, system_prompt
from bench.loadgen import Workload, noisy_schedule

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
