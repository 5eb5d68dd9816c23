"""The prefix scorer's blocks and index: text cut into chained, adapter-salted block hashes, and a
bounded LRU of them per backend (the scorer's own table: test_plugins.py; in a policy: test_policy.py)."""

from __future__ import annotations

import json

import pytest

from lorapool.router.core.openai import parse_request
from lorapool.router.core.scorers.prefix import (
    BLOCK_CHARS,
    INDEX_BLOCKS,
    MAX_BLOCKS,
    PrefixIndex,
    block_hashes,
    leading_run,
)


def text(blocks: int, tag: str = "") -> str:
    """``blocks`` whole blocks, each one different (so no two blocks' texts are equal)."""
    return "".join(f"{tag}block {i} ".ljust(BLOCK_CHARS, ".") for i in range(blocks))


@pytest.mark.parametrize(
    ("prompt", "blocks"),
    [
        ("", 0),
        ("x" * (BLOCK_CHARS - 1), 0),
        ("x" * BLOCK_CHARS, 1),
        ("x" * (2 * BLOCK_CHARS + 5), 2),
        ("x" * (BLOCK_CHARS * (MAX_BLOCKS + 50)), MAX_BLOCKS),
        ("é" * BLOCK_CHARS, 1),
    ],
    ids=["empty", "under a block", "one block", "only whole blocks", "capped", "characters, not bytes"],
)
def test_only_whole_blocks_up_to_the_cap_are_hashed(prompt: str, blocks: int) -> None:
    assert len(block_hashes("sql", prompt)) == blocks


def test_hashes_are_pinned_8_byte_integers() -> None:
    """blake2b, not hash() (salted per process): every router replica and restart hashes a prompt
    the same way; a change to the scheme shows here."""
    assert block_hashes("sql", text(2)) == (0x9751020755B96AE0, 0x8AB78A06F78FB0CC)


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [
        (("sql", text(4)), ("chat", text(4)), 0),
        (("sql", text(4)), ("sql", text(4)), 4),
        (("sql", text(4)), ("sql", text(2) + text(2, tag="new ")), 2),
        (("sql", text(4)), ("sql", "X" + text(4)[1:]), 0),
        (("sql", text(4)), ("sql", text(6)), 4),
    ],
    ids=[
        "salted by the adapter: none shared",
        "same adapter, same text: all",
        "a shared first half: two",
        "a chain: one character changed in block 0 changes every block",
        "a longer prompt extends the shorter one",
    ],
)
def test_salt_and_chain(first: tuple[str, str], second: tuple[str, str], shared: int) -> None:
    a, b = block_hashes(*first), block_hashes(*second)
    assert leading_run(b, frozenset(a)) == shared
    assert len(set(a) & set(b)) == shared  # nothing shared past the run either (the chain)


def chat(*messages: tuple[str, str]) -> str:
    """The prompt text the router reads from a chat body (both doors parse it so)."""
    body = {"model": "sql", "messages": [{"role": r, "content": c} for r, c in messages]}
    return parse_request(json.dumps(body).encode()).prompt


def test_a_conversations_next_turn_extends_the_previous_turns_prefix() -> None:
    system = ("system", "You answer questions about the orders database. " * 20)
    turn1 = chat(system, ("user", "How many orders shipped last week? " * 4))
    turn2 = chat(
        system,
        ("user", "How many orders shipped last week? " * 4),
        ("assistant", "1204 orders shipped last week."),
        ("user", "And the week before?"),
    )
    first, second = block_hashes("sql", turn1), block_hashes("sql", turn2)
    assert len(second) > len(first) > 10
    assert second[: len(first)] == first
    index = PrefixIndex()
    index.insert(first)
    assert leading_run(second, index) == len(first)


def inserted(capacity: int, *requests: tuple[int, ...]) -> PrefixIndex:
    index = PrefixIndex(capacity)
    for blocks in requests:
        index.insert(blocks)
    return index


@pytest.mark.parametrize(
    ("requests", "kept", "gone"),
    [
        (((1, 2, 3), (4, 5, 6)), {1, 4, 5, 6}, {2, 3}),
        (((1, 2, 3), (4, 5), (1,), (6, 7)), {1, 4, 6, 7}, {2, 3, 5}),
        (((1, 2), (3, 4), (1, 2), (5, 6)), {1, 2, 5, 6}, {3, 4}),
        (((1, 2, 3, 4, 5, 6),), {1, 2, 3, 4}, {5, 6}),
    ],
    ids=[
        "the least recent go, a prompt's tail before its head",
        "a re-sent head outlives blocks sent after it first",
        "a re-sent prompt is recent again",
        "one long prompt keeps its head",
    ],
)
def test_the_index_keeps_exactly_capacity_evicting_the_least_recent(
    requests: tuple[tuple[int, ...], ...], kept: set[int], gone: set[int]
) -> None:
    index = inserted(4, *requests)
    assert len(index) == 4
    assert all(h in index for h in kept) and not any(h in index for h in gone)


def test_the_default_bound_holds_at_its_size() -> None:
    index = PrefixIndex()
    for start in range(0, INDEX_BLOCKS + 3 * MAX_BLOCKS, MAX_BLOCKS):
        index.insert(tuple(range(start, start + MAX_BLOCKS)))
    assert len(index) == INDEX_BLOCKS == 16384
    newest = INDEX_BLOCKS + 3 * MAX_BLOCKS - 1
    assert newest in index and 0 not in index


@pytest.mark.parametrize("capacity", [0, -1])
def test_an_index_holds_at_least_one_hash(capacity: int) -> None:
    with pytest.raises(ValueError, match=f"capacity={capacity}"):
        PrefixIndex(capacity)


def test_clear_forgets_everything() -> None:
    index = inserted(8, (1, 2, 3))
    index.clear()
    assert len(index) == 0 and 1 not in index
