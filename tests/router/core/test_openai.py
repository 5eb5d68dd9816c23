"""What both front doors read from an OpenAI body: the model strictly, the rest leniently."""

from __future__ import annotations

import json

import pytest

from lorapool.router.core.openai import BadBody, RequestBody, parse_request


def _body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"model": "sql", "prompt": "SELECT"}, RequestBody("sql", prompt="SELECT")),
        ({"model": "sql", "prompt": ["a", "b"]}, RequestBody("sql", prompt="ab")),
        (
            {
                "model": "sql",
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            },
            RequestBody("sql", prompt="system\nbe brief\nuser\nhi\n"),
        ),
        (  # content parts: only the text ones are prompt text
            {
                "model": "sql",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url"}]}],
            },
            RequestBody("sql", prompt="user\nx\n"),
        ),
        ({"model": "sql", "max_tokens": 7}, RequestBody("sql", max_tokens=7)),
        ({"model": "sql", "max_completion_tokens": 9}, RequestBody("sql", max_tokens=9)),
        (
            {"model": "sql", "stream": True, "stream_options": {"include_usage": True}},
            RequestBody("sql", stream=True, include_usage=True),
        ),
        # Wrong types read as absent: the engine, not the router, words that 400.
        ({"model": "sql", "prompt": 3, "max_tokens": "many", "stream": "yes"}, RequestBody("sql")),
        ({"model": "sql", "max_tokens": True, "messages": "hi"}, RequestBody("sql")),
        ({"model": "sql", "messages": [1, {"role": "user"}]}, RequestBody("sql")),
    ],
)
def test_parse_request_reads_what_routing_needs(fields: dict[str, object], expected: RequestBody) -> None:
    assert parse_request(_body(**fields)) == expected


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", '"model" string'),
        (_body(prompt="x"), '"model" string'),
        (_body(model=""), '"model" string'),
        (_body(model=5), '"model" string'),
    ],
)
def test_parse_request_refuses_a_body_without_a_model(body: bytes, says: str) -> None:
    with pytest.raises(BadBody, match=says) as info:
        parse_request(body)
    assert info.value.status == 400
