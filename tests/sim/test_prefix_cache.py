"""Automatic prefix caching as vLLM V1 does it (0.32.0's ``vllm/v1/core``), on the pure engine's
virtual clock: block-hashed prompts salted by adapter name and path, hits capped so the last token
is computed, freed blocks evictable least recently used first, prefill time saved."""

from __future__ import annotations

import random

import pytest

from lorapool.sim.engine import FINISHED, AdapterRef, Engine, EngineConfig, SimRequest, run_workload
from lorapool.sim.text import (
    block_hashes,
    chat_cache_text,
    count_chat_tokens,
    count_text_tokens,
    lora_salt,
    text_cache_text,
    token_ids_cache_text,
)
from lorapool.sim.timing import TimingParams

T = TimingParams()
BS = 16
BLOCK = "x" * (BS * 4)  # one block of text: 16 tokens of 4 characters
SQL = AdapterRef(1, "sql", 16, "/adapters/sql-v1")
SQL_V2 = AdapterRef(1, "sql", 16, "/adapters/sql-v2")  # load_inplace from a new path keeps the id
CHAT = AdapterRef(2, "chat", 16, "/adapters/chat")


def text(letters: str, tail: str = "") -> str:
    """A prompt of whole blocks, one per letter, each filled with its letter, plus ``tail``."""
    return "".join(letter * (BS * 4) for letter in letters) + tail


def make_engine(**overrides: object) -> Engine:
    config: dict[str, object] = {"num_gpu_blocks": 10_000, "block_size": BS, "enable_lora": True, "max_loras": 2}
    config.update(overrides)
    return Engine(EngineConfig(**config), T)  # type: ignore[arg-type]


def request(rid: str, prompt: str, adapter: AdapterRef | None = None, out: int = 4) -> SimRequest:
    """A request with the hashes the shell computes (text.py) for ``prompt`` under ``adapter``."""
    salt = "" if adapter is None else lora_salt(adapter.name, adapter.path)
    hashes = block_hashes(text_cache_text(prompt), BS, salt)
    return SimRequest(rid, count_text_tokens(prompt), out, "length", adapter, block_hashes=hashes)


def run_one(engine: Engine, req: SimRequest) -> SimRequest:
    run_workload(engine, [(engine.clock_s, req)])
    assert req.state == FINISHED
    return req


# -- what hits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "hit_blocks"),
    [
        pytest.param((text("abcde"), None), (text("abcde"), None), 4, id="repeat-hits-all-but-the-last-block"),
        pytest.param(
            (text("abcde", tail="z"), None), (text("abcde", tail="z"), None), 5, id="repeat-past-a-boundary-hits-all"
        ),
        pytest.param((text("abcde"), None), (text("abxyz"), None), 2, id="shared-first-two-blocks-hit-two"),
        pytest.param((text("abcde"), None), (text("abcde", tail="more"), None), 5, id="longer-prompt-hits-every-block"),
        pytest.param((text("abcde"), None), (text("zbcde"), None), 0, id="first-block-differs-misses"),
        pytest.param((text("ab", tail="q"), None), (text("a"), None), 0, id="one-block-prompt-never-hits"),
        pytest.param((text("abcde"), SQL), (text("abcde"), SQL), 4, id="same-adapter-hits"),
        pytest.param((text("abcde"), SQL), (text("abcde"), CHAT), 0, id="other-adapter-misses"),
        pytest.param((text("abcde"), SQL), (text("abcde"), SQL_V2), 0, id="same-name-new-path-misses-hot-swap"),
        pytest.param((text("abcde"), SQL), (text("abcde"), None), 0, id="base-misses-an-adapters-blocks"),
        pytest.param((text("abcde"), None), (text("abcde"), SQL), 0, id="adapter-misses-the-bases-blocks"),
    ],
)
def test_which_blocks_a_second_request_hits(
    first: tuple[str, AdapterRef | None], second: tuple[str, AdapterRef | None], hit_blocks: int
) -> None:
    engine = make_engine()
    one = run_one(engine, request("one", *first))
    two = run_one(engine, request("two", *second))
    assert (one.cached_tokens, two.cached_tokens) == (0, hit_blocks * BS)
    assert engine.stats.prefix_cache_queries == one.prompt_tokens + two.prompt_tokens
    assert engine.stats.prefix_cache_hits == engine.stats.prompt_tokens_cached == hit_blocks * BS
    assert engine.kv_cache_usage == 0.0  # cached blocks no request uses are free


def test_a_request_admitted_later_in_the_same_step_hits_the_blocks_scheduled_before_it() -> None:
    """vLLM caches a block when it schedules the tokens that fill it, not when they are computed."""
    engine = make_engine()
    first, second = request("first", text("abc")), request("second", text("abc"))
    engine.add_request(first)
    engine.add_request(second)
    result = engine.step()
    assert result.prefill_tokens == 48 + 16
    assert (first.cached_tokens, second.cached_tokens) == (0, 32)


def test_chat_turns_that_resend_their_history_share_its_blocks() -> None:
    history = [{"role": "system", "content": "s" * 200}, {"role": "user", "content": "u" * 120}]
    turn_two = [*history, {"role": "assistant", "content": "a" * 90}, {"role": "user", "content": "next"}]
    engine = make_engine()
    reqs = []
    for rid, messages in (("turn-1", history), ("turn-2", turn_two)):
        tokens, _ = count_chat_tokens(messages)
        cache_text = chat_cache_text(messages)
        assert len(cache_text) == 4 * tokens  # a block of the cache text is a block of tokens
        reqs.append(SimRequest(rid, tokens, 4, block_hashes=block_hashes(cache_text, BS)))
        run_one(engine, reqs[-1])
    assert reqs[1].cached_tokens == reqs[0].prompt_tokens // BS * BS  # every full block of turn one


@pytest.mark.parametrize(
    ("cache_text", "tokens"),
    [
        pytest.param(text_cache_text("abcde"), count_text_tokens("abcde"), id="text-padded-to-whole-tokens"),
        pytest.param(token_ids_cache_text([1, 128_000, -1, 2**40]), 4, id="token-ids-four-chars-each"),
        pytest.param(
            chat_cache_text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]),
            count_chat_tokens([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])[0],
            id="chat-template",
        ),
    ],
)
def test_cache_text_has_four_characters_per_token(cache_text: str, tokens: int) -> None:
    assert len(cache_text) == 4 * tokens


def test_block_hashes_are_chained_salted_and_stable() -> None:
    assert block_hashes(BLOCK * 3, BS) == block_hashes(BLOCK * 3 + "x" * 63, BS)  # full blocks only
    assert block_hashes(BLOCK * 2, BS) == block_hashes(BLOCK * 3, BS)[:2]
    assert block_hashes("y" + BLOCK * 2, BS)[1] != block_hashes(BLOCK * 3, BS)[1]  # a block's hash holds its prefix
    assert block_hashes(BLOCK, BS, lora_salt("a", "/p")) != block_hashes(BLOCK, BS, lora_salt("a", "/q"))
    assert block_hashes(BLOCK, BS) == (3_151_288_566_462_383_580,)  # hashlib, never per-process hash()


# -- the time it saves ----------------------------------------------------------------------------


def test_a_repeated_prompt_prefills_only_its_uncached_tokens() -> None:
    engine = make_engine(enable_lora=False)
    prompt = text("abcdefgh")  # 128 tokens, 8 blocks: the repeat hits 7
    first = run_one(engine, request("first", prompt))
    second = run_one(engine, request("second", prompt))
    ttft = [r.first_token_s - r.arrival_s for r in (first, second)]
    assert ttft == [pytest.approx(T.forward_s(1, 128, 0)), pytest.approx(T.forward_s(1, 16, 0))]
    assert ttft[1] < ttft[0]


def test_a_hit_spends_no_token_budget_on_cached_tokens() -> None:
    engine = make_engine(enable_lora=False, max_num_batched_tokens=64)
    run_one(engine, request("warm", text("abcdefgh")))
    again = request("again", text("abcdefgh"))
    engine.add_request(again)
    result = engine.step()  # 112 cached tokens, 16 to compute: one step instead of two
    assert (result.prefill_tokens, len(result.emitted)) == (16, 1)


# -- eviction -------------------------------------------------------------------------------------


def small_engine() -> Engine:
    return make_engine(enable_lora=False, num_gpu_blocks=8, max_model_len=64)


def test_freed_blocks_are_evicted_least_recently_used_first_tail_first() -> None:
    engine = small_engine()
    a, b, c = (request(name, text(name * 3), out=1) for name in "abc")  # three blocks each, of 8
    run_one(engine, a)
    run_one(engine, b)
    # vLLM frees a request's blocks in reverse: its tail is the first evicted
    assert engine.evictable_blocks() == (*reversed(a.block_hashes), *reversed(b.block_hashes))
    again = run_one(engine, request("a-again", text("aaa"), out=1))
    assert again.cached_tokens == 32  # a's blocks were used again: now the most recent
    assert engine.evictable_blocks() == (*reversed(b.block_hashes), *reversed(a.block_hashes))
    run_one(engine, c)  # 2 blocks never cached are left: c's third block evicts b's tail, only
    assert engine.evictable_blocks() == (
        *reversed(b.block_hashes[:2]),
        *reversed(a.block_hashes),
        *reversed(c.block_hashes),
    )
    assert engine.kv_cache_usage == 0.0


def test_a_block_in_use_is_never_evicted() -> None:
    engine = small_engine()
    long = request("long", text("lll"), out=16)  # 3 prompt blocks, 4 at its end
    engine.add_request(long)
    engine.step()
    for i in range(10):  # distinct 2-block prompts churn the other 4 blocks over and over
        churn = request(f"churn-{i}", text(chr(ord("m") + i) * 2), out=1)
        engine.add_request(churn)
        for _ in range(10):  # bounded: one step does it, a preemption a few more
            engine.step()
            assert engine.cached_prefix_blocks(long.block_hashes) == 3
            if churn.state == FINISHED:
                break
        assert churn.state == FINISHED
    assert long.state != FINISHED
    sharer = request("sharer", text("lll"), out=1)
    engine.add_request(sharer)
    engine.step()
    assert sharer.cached_tokens == 32  # shared with the running request, by reference


# -- KV accounting, preemption, and caching off ---------------------------------------------------


def shared_prefix_workload(seed: int, count: int, adapters: bool) -> list[tuple[float, SimRequest]]:
    """Requests over a few shared system prompts, some under adapters, some repeated."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(40.0)
        system = "abcd"[rng.randrange(4)] * (BS * 4 * rng.randint(1, 6))
        adapter = rng.choice((None, SQL, CHAT)) if adapters else None
        prompt = system + rng.choice(("", "q" * rng.randint(1, 300)))
        out.append((t, request(f"r{i}", prompt, adapter, out=rng.randint(1, 80))))
    return out


def test_kv_accounting_stays_consistent_under_preemption() -> None:
    engine = make_engine(num_gpu_blocks=40, max_model_len=512, max_num_batched_tokens=256)
    workload = shared_prefix_workload(seed=3, count=150, adapters=True)
    pending = list(workload)
    for _ in range(100_000):  # bounded: a scheduler bug fails instead of spinning
        if not (pending or engine.has_work):
            break
        while pending and pending[0][0] <= engine.clock_s:
            engine.add_request(pending.pop(0)[1])
        if not engine.has_work:
            engine.clock_s = pending[0][0]
            continue
        engine.step()
        evictable = engine.evictable_blocks()
        assert len(set(evictable)) == len(evictable) <= engine.free_blocks <= 40
    assert engine.stats.preemptions > 0, "the workload must preempt to test anything"
    assert all(r.state == FINISHED and r.generated == r.output_tokens for _, r in workload)
    assert engine.free_blocks == 40 and engine.kv_cache_usage == 0.0
    assert engine.stats.prefix_cache_hits > 0
    # a preempted request's re-admission is not a query (vLLM counts it apart)
    assert engine.stats.prefix_cache_queries == sum(r.prompt_tokens for _, r in workload)


def fingerprint(engine: Engine, workload: list[tuple[float, SimRequest]]) -> list[tuple[float, int, int, int]]:
    steps = run_workload(engine, workload)
    return [(s.duration_s, s.num_seqs, s.prefill_tokens, s.preempted) for s in steps]


def without_hashes(workload: list[tuple[float, SimRequest]]) -> list[tuple[float, SimRequest]]:
    return [(t, SimRequest(r.request_id, r.prompt_tokens, r.output_tokens, adapter=r.adapter)) for t, r in workload]


def test_caching_off_or_no_hashes_schedules_as_before() -> None:
    """Off, or with no hashes given, the engine is the one without a prefix cache: the same steps."""
    config = {"num_gpu_blocks": 40, "max_model_len": 512, "max_num_batched_tokens": 256}
    off = fingerprint(make_engine(enable_prefix_caching=False, **config), shared_prefix_workload(5, 120, True))
    plain = fingerprint(make_engine(**config), without_hashes(shared_prefix_workload(5, 120, True)))
    on = make_engine(**config)
    cached = fingerprint(on, shared_prefix_workload(5, 120, True))
    assert off == plain
    assert sum(s[2] for s in cached) < sum(s[2] for s in off)  # on, it prefills less
    off_engine = make_engine(enable_prefix_caching=False)
    run_workload(off_engine, shared_prefix_workload(5, 20, False))
    assert (off_engine.stats.prefix_cache_queries, off_engine.stats.prefix_cache_hits) == (0, 0)


def test_more_hashes_than_full_blocks_is_a_shell_bug() -> None:
    with pytest.raises(ValueError, match="at most one per full block"):
        make_engine().add_request(SimRequest("r", 20, 1, block_hashes=(1, 2)))
