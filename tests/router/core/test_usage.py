"""A response's token use: the engine's usage when it says, else the estimate plus what streamed."""

from __future__ import annotations

import json

from lorapool.router.core.usage import UsageMeter


def sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def test_a_json_body_reports_its_usage() -> None:
    meter = UsageMeter(prompt_tokens=10, stream=False)
    body = json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 7, "total_tokens": 12}}).encode()
    meter.feed(body[:9])
    meter.feed(body[9:])
    assert meter.total() == 12


def test_a_body_without_usage_counts_the_estimate() -> None:
    meter = UsageMeter(prompt_tokens=10, stream=False)
    meter.feed(b'{"error": {"message": "bad"}}')
    assert meter.total() == 10


def test_a_stream_with_include_usage_reports_it_split_anywhere() -> None:
    data = sse(
        {"choices": [{"text": "a"}], "usage": None},
        {"choices": [{"text": "b"}], "usage": None},
        {"choices": [], "usage": {"total_tokens": 42}},
    )
    for size in (1, 7, len(data)):
        meter = UsageMeter(prompt_tokens=3, stream=True)
        for i in range(0, len(data), size):
            meter.feed(data[i : i + size])
        assert meter.total() == 42, size


def test_a_stream_without_usage_counts_what_was_streamed() -> None:
    data = sse(
        {"choices": [{"delta": {"role": "assistant"}}]},  # no content: not a token
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
        {"choices": [{"text": "!"}]},
    )
    meter = UsageMeter(prompt_tokens=5, stream=True)
    meter.feed(data)
    assert meter.total() == 5 + 3


def test_garbage_in_a_stream_is_skipped_and_the_buffer_stays_bounded() -> None:
    meter = UsageMeter(prompt_tokens=1, stream=True)
    meter.feed(b"data: {not json\n\ndata: [1]\n\n: comment\n\n")
    meter.feed(b"x" * (3 << 20))  # a line with no end
    assert len(meter._partial) <= 1 << 20
    assert meter.total() == 1


def test_split_gives_prompt_and_completion_from_usage_else_the_estimate_and_the_stream() -> None:
    body = {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}
    meter = UsageMeter(prompt_tokens=10, stream=False)
    meter.feed(json.dumps(body).encode())
    assert meter.split() == (7, 5) and meter.fed > 0
    streamed = UsageMeter(prompt_tokens=3, stream=True)
    streamed.feed(sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}))
    assert streamed.split() == (3, 2)
    no_split = UsageMeter(prompt_tokens=3, stream=True)  # a usage without completion_tokens: all of it prompt
    no_split.feed(sse({"choices": [], "usage": {"total_tokens": 9}}))
    assert no_split.split() == (9, 0)
    assert UsageMeter(prompt_tokens=4, stream=True).fed == 0  # nothing seen (the gateway sent no body)
