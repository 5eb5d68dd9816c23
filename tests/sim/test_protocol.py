"""Request checks vLLM makes before generating, and the error shape it answers with."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lorapool.sim.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    ChunkTemplate,
    RequestError,
    chat_chunk,
    check_context,
    completion_chunk,
    error_body,
    parse_generation,
)


def test_error_shape_is_vllm_0_10_1_and_later() -> None:
    assert error_body("boom", "NotFoundError", 404, "model") == {
        "error": {"message": "boom", "type": "NotFoundError", "param": "model", "code": 404}
    }


def test_completion_defaults() -> None:
    gen = parse_generation({"model": "m", "prompt": "abcdefgh"}, chat=False)
    assert (gen.prompt_tokens, gen.max_tokens, gen.stream, gen.include_usage) == (
        2,
        COMPLETIONS_DEFAULT_MAX_TOKENS,
        False,
        False,
    )


def test_explicit_null_max_tokens_means_the_rest_of_the_context() -> None:
    gen = parse_generation({"prompt": "abcd", "max_tokens": None}, chat=False)
    assert gen.max_tokens is None
    assert check_context(gen.prompt_tokens, gen.max_tokens, 100) == 99


def test_chat_leaves_max_tokens_to_the_context() -> None:
    gen = parse_generation({"messages": [{"role": "user", "content": "hi"}]}, chat=True)
    assert gen.model is None and gen.max_tokens is None
    assert check_context(gen.prompt_tokens, gen.max_tokens, 100) == 100 - gen.prompt_tokens
    both = parse_generation(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "max_completion_tokens": 3}, chat=True
    )
    assert both.max_tokens == 3


def test_token_id_prompts_count_one_token_each() -> None:
    assert parse_generation({"prompt": [1, 2, 3, 4, 5]}, chat=False).prompt_tokens == 5


@pytest.mark.parametrize(
    ("body", "chat", "err_type", "param"),
    [
        # vLLM's own checks: BadRequestError; what pydantic cannot coerce: FastAPI's "Bad Request"
        pytest.param({}, False, "BadRequestError", "prompt", id="no-prompt"),
        pytest.param({"prompt": ["a", "b"]}, False, "BadRequestError", "prompt", id="batch-of-prompts"),
        pytest.param({"prompt": "x", "max_tokens": 0}, False, "BadRequestError", "max_tokens", id="max-tokens-zero"),
        pytest.param(
            {"prompt": "x", "max_tokens": "five"}, False, "Bad Request", "body.max_tokens", id="max-tokens-not-a-number"
        ),
        pytest.param({"prompt": "x", "n": 0}, False, "BadRequestError", None, id="n-zero"),
        pytest.param({"prompt": "x", "n": 2, "stream": True}, False, "BadRequestError", "n", id="n-above-1-streamed"),
        pytest.param(
            {"prompt": "x", "stream": "maybe"}, False, "Bad Request", "body.stream", id="stream-not-a-boolean"
        ),
        pytest.param(
            {"prompt": "x", "stream_options": {"include_usage": True}},
            False,
            "BadRequestError",
            "stream_options",
            id="options-without-stream",
        ),
        pytest.param({"prompt": "x", "model": 3}, False, "Bad Request", "body.model", id="model-not-string"),
        pytest.param({"messages": []}, True, "BadRequestError", None, id="no-messages"),
        pytest.param({"messages": "hi"}, True, "Bad Request", "body.messages", id="messages-not-a-list"),
        pytest.param({"messages": [{"content": "x"}]}, True, "Bad Request", "body.messages", id="message-without-role"),
        pytest.param(
            {"messages": [{"role": "user", "content": 5}]}, True, "Bad Request", "body.messages", id="content-not-text"
        ),
    ],
)
def test_bad_bodies_are_400(body: Any, chat: bool, err_type: str, param: str | None) -> None:
    with pytest.raises(RequestError) as caught:
        parse_generation(body, chat=chat)
    assert (caught.value.status, caught.value.err_type, caught.value.param) == (400, err_type, param)


@pytest.mark.parametrize(
    ("field", "value", "parsed"),
    [
        ("max_tokens", "5", 5),
        ("max_tokens", 5.0, 5),
        ("stream", "yes", True),
        ("stream", 0, False),
        ("ignore_eos", "on", True),
    ],
)
def test_fields_are_read_as_pydantics_lax_mode_does(field: str, value: Any, parsed: object) -> None:
    gen = parse_generation({"prompt": "x", field: value}, chat=False)
    assert getattr(gen, field) == parsed


def test_a_body_that_is_not_an_object_is_fastapis_validation_error() -> None:
    with pytest.raises(RequestError) as caught:
        parse_generation([1], chat=False)
    assert (caught.value.status, caught.value.err_type, caught.value.param) == (400, "Bad Request", "body")


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "param", "text"),
    [
        pytest.param(
            101, 1, "input_tokens", "your prompt contains at least 101 input tokens", id="prompt-over-context"
        ),
        pytest.param(100, 1, "input_tokens", "your prompt contains 100 input tokens", id="prompt-fills-context"),
        pytest.param(
            10,
            120,
            "max_tokens",
            "max_tokens=120 cannot be greater than max_model_len=100.",
            id="max-tokens-over-context",
        ),
    ],
)
def test_context_length_checks(prompt: int, max_tokens: int, param: str, text: str) -> None:
    with pytest.raises(RequestError) as caught:
        check_context(prompt, max_tokens, 100)
    assert caught.value.param == param
    assert text in caught.value.message


def test_context_that_fits_passes() -> None:
    assert check_context(90, 10, 100) == 10


def test_output_that_would_overflow_the_context_is_capped_as_vllm_0_32_does() -> None:
    assert check_context(90, 20, 100) == 10


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("finish", [None, "length", "stop"])
def test_chunk_template_renders_what_the_dict_builders_describe(chat: bool, finish: str | None) -> None:
    template = ChunkTemplate("cmpl-1", 1700000000, "sql", chat)
    rendered = template.render(" hello world", finish)
    assert rendered.startswith(b"data: ") and rendered.endswith(b"\n\n")
    expected = (
        chat_chunk("cmpl-1", 1700000000, "sql", {"content": " hello world"}, finish)
        if chat
        else completion_chunk("cmpl-1", 1700000000, "sql", " hello world", finish)
    )
    assert json.loads(rendered[len(b"data: ") :]) == expected
