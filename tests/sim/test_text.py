"""Token counting heuristics and seeded output text."""

from __future__ import annotations

import pytest

from lorapool.sim.text import (
    count_chat_tokens,
    count_text_tokens,
    message_text,
    natural_output_tokens,
    output_text,
    request_seed,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        pytest.param("", 1, id="empty-is-one"),
        pytest.param("a", 1, id="one-char"),
        pytest.param("abcd", 1, id="four-chars"),
        pytest.param("abcde", 2, id="five-chars"),
        pytest.param("x" * 400, 100, id="four-hundred-chars"),
    ],
)
def test_text_tokens_are_a_quarter_of_the_characters(text: str, tokens: int) -> None:
    assert count_text_tokens(text) == tokens


def test_chat_tokens_add_the_llama3_template() -> None:
    tokens, _ = count_chat_tokens([{"role": "user", "content": "abcdefgh"}])
    assert tokens == 1 + 4 + 5 + 2
    two, _ = count_chat_tokens([{"role": "system", "content": "abcd"}, {"role": "user", "content": "abcdefgh"}])
    assert two == tokens + 5 + 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("hi", "hi", id="string"),
        pytest.param(None, "", id="none"),
        pytest.param([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\nb", id="parts"),
    ],
)
def test_message_text(content: object, expected: str) -> None:
    assert message_text(content) == expected


@pytest.mark.parametrize(
    "content",
    [
        pytest.param([{"type": "image_url", "image_url": {"url": "x"}}], id="image-part"),
        pytest.param(42, id="number"),
        pytest.param([{"type": "text"}], id="part-without-text"),
    ],
)
def test_message_text_refuses_what_it_cannot_count(content: object) -> None:
    with pytest.raises(ValueError):
        message_text(content)


def test_same_inputs_same_text_and_length() -> None:
    seed = request_seed(0, "m", "prompt", None)
    assert seed == request_seed(0, "m", "prompt", None)
    assert output_text(seed, 0, 20) == output_text(request_seed(0, "m", "prompt", None), 0, 20)
    assert seed != request_seed(1, "m", "prompt", None)  # server --seed
    assert seed != request_seed(0, "other", "prompt", None)  # another adapter
    assert seed != request_seed(0, "m", "prompt", 7)  # the request's own seed
    assert output_text(seed, 0, 20) != output_text(request_seed(1, "m", "prompt", None), 0, 20)


def test_text_does_not_depend_on_how_the_stream_was_chunked() -> None:
    seed = request_seed(3, "m", "p", None)
    whole = output_text(seed, 0, 30)
    assert output_text(seed, 0, 7) + output_text(seed, 7, 19) + output_text(seed, 19, 30) == whole
    assert len(whole.split()) == 30


def test_output_counts_back_to_about_its_token_count() -> None:
    text = output_text(request_seed(0, "m", "p", None), 0, 200)
    assert 150 <= count_text_tokens(text) <= 300


def test_natural_length_stays_in_range() -> None:
    lengths = {natural_output_tokens(request_seed(0, "m", str(i), None), 8, 512) for i in range(500)}
    assert min(lengths) >= 8
    assert max(lengths) <= 512
    assert len(lengths) > 200  # spread out, not constant
