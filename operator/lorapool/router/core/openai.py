"""The OpenAI request and error shapes both front doors share. Pure.

The HTTP proxy (``router.app``) and the endpoint picker (``router.picker``) read a request's
``model`` and word their errors here, so a bad body gets the same answer through either door.
"""

from __future__ import annotations

import json
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


def requested_model(body: bytes) -> str:
    """The ``model`` an OpenAI completions or chat body names; raises ``BadBody`` saying what is wrong."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadBody(f"request body is not valid JSON: {exc}") from None
    model = payload.get("model") if isinstance(payload, dict) else None
    if not isinstance(model, str) or not model:
        raise BadBody('request body needs a "model" string naming the base model or an adapter', "model")
    return model


def too_large_message(size: int | None, limit: int) -> str:
    """413's message: the body (of ``size`` bytes, when known) exceeds ``--max-body-bytes``."""
    got = f"{size} bytes" if size is not None else "the body"
    return f"{got} exceeds the router's limit of {limit} bytes (--max-body-bytes)"
