"""Regime (g), chat: multi-turn sessions with long per-adapter system prompts (issue 28). Pure.

Real traffic on fine-tuned models is mostly chat: each tenant's adapter has a long system prompt,
and a conversation resends its whole history at every turn. A session belongs to one adapter
(drawn by the workload's popularity, as any request is), starts at a Poisson arrival and sends
``turns`` requests ``think_s`` apart. Turn k's prompt is the adapter's system prompt, the earlier
turns (the user's words and a stand-in for the answer), then the new user words: it begins with
turn k-1's whole prompt, the prefix the replica that served turn k-1 holds in its KV cache, and
every session of an adapter shares the system prompt. Open loop: a turn is sent at its time
whether or not the previous one was answered (the answer in the history is a stand-in, not what
the engine said), so every system gets the very same requests.

``rate_rps`` stays the request rate (sessions start at ``rate_rps / turns``), so a chat scenario
loads the pool as a single-request one of the same rate does.
"""

from __future__ import annotations

import random

from bench.loadgen import Planned, Workload, adapter_picker, noisy_schedule
from lorapool.sim.text import block_hashes, count_text_tokens, text_cache_text


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(10_000)}" for _ in range(n))


def system_prompt(w: Workload, model: str) -> str:
    """The adapter's system prompt: the same for every session of the adapter, other for each adapter."""
    rng = random.Random(f"{w.seed}/{model}")  # str seeds are hashed with sha512: stable across runs
    return f"[{model}] System: " + _words(rng, w.system_prompt_words)


def chat_schedule(w: Workload) -> list[Planned]:
    """Every turn of every session that starts within the run, in time order; turns past the end are cut."""
    if w.turns < 1:
        raise ValueError(f"a chat workload needs turns >= 1, got {w.turns}")
    rng = random.Random(w.seed)
    pick = adapter_picker(w, rng)
    prompts: dict[str, str] = {}
    plan: list[Planned] = []
    t = 0.0
    while True:
        t += rng.expovariate(w.rate_rps / w.turns)
        if t >= w.duration_s:
            return sorted(plan, key=lambda p: p.at_s)
        model = pick()
        if model not in prompts:
            prompts[model] = system_prompt(w, model)
        history = prompts[model]
        for turn in range(w.turns):
            prompt = f"{history}\nUser: {_words(rng, rng.randint(*w.prompt_tokens))}\nAssistant:"
            answer = rng.randint(*w.output_tokens)
            at = t + turn * w.think_s
            if at < w.duration_s:
                plan.append(Planned(at, model, prompt, answer))
            history = f"{prompt} {_words(rng, answer)}"


def arrivals(w: Workload) -> list[Planned]:
    """A run's requests: chat sessions when the workload has turns, else ``noisy_schedule``'s."""
    return chat_schedule(w) if w.turns else noisy_schedule(w)


def cacheable_fraction(plan: list[Planned], block_size: int) -> float:
    """The prompt tokens a prefix cache could serve at best: each adapter on one replica with an
    unbounded cache, so a request hits every full block an earlier request of its adapter computed
    (as the simulator counts hits: whole blocks, at most ``tokens - 1``). No router reaches more;
    the rest (each turn's new words) is always prefilled."""
    seen: dict[str, set[int]] = {}
    queried = hit = 0
    for p in plan:
        hashes = block_hashes(text_cache_text(p.prompt), block_size, p.model)
        tokens = count_text_tokens(p.prompt)
        cached = seen.setdefault(p.model, set())
        run = next((i for i, h in enumerate(hashes) if h not in cached), len(hashes))
        queried += tokens
        hit += min(run, (tokens - 1) // block_size) * block_size
        cached.update(hashes)
    return hit / queried if queried else 0.0
