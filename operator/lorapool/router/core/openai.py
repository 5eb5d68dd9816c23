"""The OpenAI request and error shapes both front doors share. Pure.

The HTTP proxy (``router.app``) and the endpoint picker (``router.picker``) read a request's
``model`` and word their errors here, so a bad body gets the same answer through either door.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class BadBody(ValueError):
    """A request body the router cannot route: 400 with ``message`` (and the ``param`` it is about)."""

    status = 400
    error_type = "BadRequestError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """An error in the OpenAI/vLLM shape, which the official clients turn into exceptions."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True, slots=True)
class RequestBody:
    """What routing reads from an OpenAI completions or chat body (never logged: it holds the prompt)."""

    model: str
    # The prompt as text, in the order the engine sees it: ``prompt`` (a list's strings joined), or
    # each chat message's role and text content; "" when the body has none the router can read.
    prompt: str = ""
    max_tokens: int | None = None  # max_tokens, else max_completion_tokens; None: the engine's default
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: the last chunk carries usage
    token_ids: int = 0  # a prompt given as token ids: how many (their text is not read)

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens as the router can estimate them: a token-id prompt's length, else
        about four characters a token (OpenAI's rule of thumb for English; the engine's usage
        settles the difference when the response ends)."""
        return self.token_ids + (len(self.prompt) + 3) // 4


def parse_request(body: bytes) -> RequestBody:
    """Read an OpenAI completions or chat body; raises ``BadBody`` saying what is wrong.

    Only ``model`` is required: the rest is read leniently (a field of the wrong type reads as
    absent), because the engine, not the router, validates the request and words its 400."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadBody(f"request body is not valid JSON: {exc}") from None
    model = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(model, str) or not model:
        raise BadBody('request body needs a "model" string naming the base model or an adapter', "model")
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
    options = payload.get("stream_options")
    return RequestBody(
        model=model,
        prompt=_prompt_text(payload),
        max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
        stream=payload.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        token_ids=_token_ids(payload.get("prompt")),
    )


def requested_model(body: bytes) -> str:
    """The ``model`` an OpenAI completions or chat body names; raises ``BadBody`` saying what is wrong."""
    return parse_request(body).model


def _prompt_text(payload: dict[str, Any]) -> str:
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: only the text ones count
            content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if isinstance(content, str):
            parts.append(f"{message.get('role', '')}\n{content}\n")
    return "".join(parts)


def _token_ids(prompt: Any) -> int:
    """Tokens in a prompt given as ids: a list of ints, or a list of such lists (a batch)."""
    if not isinstance(prompt, list) or not prompt:
        return 0
    if all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, list) and all(isinstance(t, int) for t in p))


def too_large_message(size: int | None, limit: int) -> str:
    """413's message: the body (of ``size`` bytes, when known) exceeds ``--max-body-bytes``."""
    got = f"{size} bytes" if size is not None else "the body"
    return f"{got} exceeds the router's limit of {limit} bytes (--max-body-bytes)"
