"""vLLM's OpenAI-compatible request checks and response shapes. Pure: dicts in, dicts out.

Shapes follow vLLM 0.10.1 and later (``vllm/entrypoints/openai/protocol.py`` and the serving
classes): errors are ``{"error": {"message", "type", "param", "code"}}`` (the older top-level
``{"object": "error", ...}`` shape was replaced by vLLM PR #22099); completions carry
``stop_reason`` and ``prompt_logprobs``; streamed usage arrives in a last chunk with empty
``choices`` when ``stream_options.include_usage`` is set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lorapool.sim.text import (
    chat_cache_text,
    count_chat_tokens,
    count_text_tokens,
    text_cache_text,
    token_ids_cache_text,
)

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default, as OpenAI's legacy API

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class RequestError(Exception):
    """A request vLLM answers with an error body instead of generating."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message
        self.param = param


def dumps(obj: Any) -> bytes:
    """Compact JSON, as vLLM's pydantic ``model_dump_json``."""
    return _dumps(obj).encode()


def error_body(message: str, err_type: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": sanitize_message(message), "type": err_type, "param": param, "code": status}}


_SYSTEM_PATH = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_FILE_PATH = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def sanitize_message(message: str) -> str:
    """Hide file paths as vLLM 0.32 does in every error message (they become ``<path>``)."""
    return _FILE_PATH.sub("<path>", _SYSTEM_PATH.sub("<path>", message)).strip()


def invalid_body(detail: str, loc: str | None) -> RequestError:
    """FastAPI's request-validation error as vLLM 0.32 answers it: 400, type ``Bad Request``,
    ``param`` = pydantic's location (``body``, ``body.lora_path``, ``body.<offset>``)."""
    return RequestError(400, "Bad Request", f"1 validation error:\n  {detail}", loc)


def missing_field(field: str, body: Mapping[str, Any]) -> RequestError:
    detail = {
        "type": "missing",
        "loc": f"body.{field}",
        "msg": "Field required",
        "input": f"<dict of {len(body)} items>",
    }
    return invalid_body(repr(detail), f"body.{field}")


def not_an_object(body: Any) -> RequestError:
    kind = type(body).__name__
    detail = {
        "type": "model_attributes_type",
        "loc": "body",
        "msg": "Input should be a valid dictionary or object to extract fields from",
        "input": f"<{kind} of {len(body)} items>" if isinstance(body, list | dict) else repr(body),
    }
    return invalid_body(repr(detail), "body")


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, "BadRequestError", message, param)


@dataclass(frozen=True, slots=True)
class Generation:
    """A parsed /v1/completions or /v1/chat/completions request."""

    chat: bool
    model: str | None
    prompt: str  # what seeds the output text
    prompt_tokens: int
    cache_text: str  # the prompt as the prefix cache sees it, 4 characters per token (text.py)
    max_tokens: int | None
    max_tokens_param: str  # the field the client set ("max_tokens" or "max_completion_tokens")
    n: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    seed: int | None


def parse_generation(body: Any, *, chat: bool) -> Generation:
    """Check a request body the way vLLM's request models do; raise RequestError if refused.

    Field types follow pydantic's lax mode, as vLLM's request models: ``"5"`` is a valid
    ``max_tokens`` and ``"yes"`` a valid ``stream``; a value it cannot coerce is FastAPI's
    400 ``Bad Request`` naming ``body.<field>``. vLLM's own checks are 400 ``BadRequestError``.
    """
    if not isinstance(body, Mapping):
        raise not_an_object(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise wrong_type("model", model, "string_type", "Input should be a valid string")
    n = lax_int(body, "n", 1)
    if n is None:
        n = 1
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.")
    stream = lax_bool(body, "stream", False)
    if n > 1 and stream:
        raise bad_request("the simulator streams n=1 only (n > 1 works without stream)", "n")
    if chat:
        prompt, prompt_tokens, cache_text, max_tokens, param = _chat_prompt(body)
    else:
        param = "max_tokens"
        prompt, prompt_tokens, cache_text = _completion_prompt(body.get("prompt"))
        max_tokens = lax_int(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})", "max_tokens"
        )
    include_usage = _include_usage(body, stream=stream)
    return Generation(
        chat=chat,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        cache_text=cache_text,
        max_tokens=max_tokens,
        max_tokens_param=param,
        n=n,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=bool(lax_bool(body, "ignore_eos", False)),
        seed=lax_int(body, "seed"),
    )


def _chat_prompt(body: Mapping[str, Any]) -> tuple[str, int, str, int | None, str]:
    """A chat request's prompt text, its tokens, its cache text, its token limit and the field
    that set the limit.

    Apart from ``parse_generation`` because chat differs in all three: messages, not a prompt,
    are checked and counted under the chat template, and ``max_completion_tokens`` wins over
    ``max_tokens``, the field named in any later error."""
    messages = body.get("messages")
    if isinstance(messages, list) and not messages:
        raise bad_request("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if not isinstance(messages, list):
        raise wrong_type("messages", messages, "list_type", "Input should be a valid list")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise wrong_type(f"messages.{index}", message, "model_type", "Input should be a valid dictionary")
    try:
        prompt_tokens, prompt = count_chat_tokens(messages)
    except ValueError as exc:
        # pydantic tries every message type of the union; its first location is as good as ours
        raise invalid_body(str(exc), "body.messages") from exc
    max_tokens = lax_int(body, "max_completion_tokens")
    param = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, param = lax_int(body, "max_tokens"), "max_tokens"
    return prompt, prompt_tokens, chat_cache_text(messages), max_tokens, param


def _include_usage(body: Mapping[str, Any], *, stream: bool) -> bool:
    """``stream_options.include_usage``, refused as vLLM refuses it: not an object, or without ``stream``."""
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise wrong_type("stream_options", options, "model_type", "Input should be a valid dictionary")
    if options is not None and not stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)", "stream_options"
        )
    return bool(options and options.get("include_usage"))


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def wrong_type(field: str, value: Any, kind: str, msg: str) -> RequestError:
    """FastAPI's 400 for a value pydantic cannot coerce to the field's type."""
    detail = {"type": kind, "loc": f"body.{field}", "msg": msg, "input": repr(value)}
    return invalid_body(repr(detail), f"body.{field}")


def lax_int(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    """An optional integer field as pydantic's lax mode reads it (``5``, ``5.0``, ``"5"``); null is None."""
    if key not in body:
        return default
    value = body[key]
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise wrong_type(key, value, "int_parsing", "Input should be a valid integer, unable to parse string as an integer")


def lax_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean field as pydantic's lax mode reads it (``true``, ``1``, ``"yes"``, ``"off"``, ...)."""
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise wrong_type(key, value, "bool_parsing", "Input should be a valid boolean, unable to interpret input")


def _completion_prompt(prompt: Any) -> tuple[str, int, str]:
    """The prompt's seed text, its tokens and its cache text."""
    if isinstance(prompt, str) and prompt:
        return prompt, count_text_tokens(prompt), text_cache_text(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], count_text_tokens(prompt[0]), text_cache_text(prompt[0])
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return ",".join(map(str, prompt)), len(prompt), token_ids_cache_text(prompt)
    if prompt is None or prompt in ("", []):
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)", "prompt")
    raise bad_request("the simulator serves one prompt per request (a string or a list of token ids)", "prompt")


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int, param: str = "max_tokens") -> int:
    """vLLM 0.32's context-length checks; return the output budget.

    A prompt longer than the context and a ``max_tokens`` above ``max_model_len`` are refused;
    otherwise the budget is capped to what the context has left (vLLM 0.32 no longer refuses
    ``prompt + max_tokens > max_model_len``), and a chat request without a limit gets the rest.
    """
    if prompt_tokens >= max_model_len:
        qualifier = "at least " if prompt_tokens == max_model_len + 1 else ""
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains {qualifier}{prompt_tokens} input tokens, which exceeds this limit even without "
            f"any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_tokens})",
            "input_tokens",
        )
    if max_tokens is not None and max_tokens > max_model_len:
        raise bad_request(
            f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter={param}, value={max_tokens})",
            param,
        )
    left = max_model_len - prompt_tokens
    return left if max_tokens is None else min(max_tokens, left)


def usage(prompt_tokens: int, completion_tokens: int, prompt_details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": None,
    }


def prompt_tokens_details(cached_tokens: int, created_cache_tokens: int | None, *, streamed: bool) -> dict[str, Any]:
    """vLLM's ``PromptTokenUsageInfo``, sent only with ``--enable-prompt-tokens-details`` (off by
    default): the prompt tokens its prefix cache served; chat also reports the tokens it cached
    (``created_cache_tokens``), completions leave it null. vLLM's streamed usage chunk omits nulls."""
    details = {"cached_tokens": cached_tokens, "created_cache_tokens": created_cache_tokens, "multimodal_tokens": None}
    return {key: value for key, value in details.items() if value is not None} if streamed else details


SYSTEM_FINGERPRINT = "lorapool-sim"


def completion_choice(index: int, text: str, finish: str) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }


def chat_choice(index: int, text: str, finish: str) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    return {
        "index": index,
        "message": message,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }


def _answer(
    kind: str, rid: str, created: int, model: str, choices: list[dict[str, Any]], used: dict[str, Any]
) -> dict[str, Any]:
    """The keys vLLM 0.32 sends around the choices of a non-streamed answer, in its order."""
    return {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": used,
    }


def completion(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    used: dict[str, Any],
    *,
    choices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A /v1/completions answer (vLLM 0.32's keys); ``choices`` replaces the single one for n > 1."""
    picked = choices if choices is not None else [completion_choice(0, text, finish)]
    return {
        **_answer("text_completion", rid, created, model, picked, used),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_completion(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    used: dict[str, Any],
    *,
    choices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A /v1/chat/completions answer (vLLM 0.32's keys)."""
    picked = choices if choices is not None else [chat_choice(0, text, finish)]
    return {
        **_answer("chat.completion", rid, created, model, picked, used),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    """A chat SSE chunk; as vLLM 0.32 the role chunk has no ``token_ids``, the last one a ``stop_reason``."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    if "role" not in delta:
        choice["token_ids"] = None
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


class ChunkTemplate:
    """One request's SSE chunk, rendered once and filled per write (the streaming hot path).

    The shape comes from ``completion_chunk`` / ``chat_chunk`` with a placeholder text, so it
    cannot drift from them. ``text`` must need no JSON escaping: the simulator's output words
    are plain ASCII letters and spaces (checked in ``text.py``).
    """

    _MARK = "\x00text\x00"

    def __init__(self, rid: str, created: int, model: str, chat: bool) -> None:
        self._parts: dict[str | None, tuple[bytes, bytes]] = {}
        self._args = (rid, created, model, chat)

    def render(self, text: str, finish: str | None) -> bytes:
        parts = self._parts.get(finish)
        if parts is None:
            rid, created, model, chat = self._args
            if chat:
                event = chat_chunk(rid, created, model, {"content": self._MARK}, finish)
            else:
                event = completion_chunk(rid, created, model, self._MARK, finish)
            head, _, tail = (b"data: " + dumps(event) + b"\n\n").partition(dumps(self._MARK)[1:-1])
            parts = self._parts[finish] = (head, tail)
        return parts[0] + text.encode() + parts[1]


def usage_chunk(rid: str, created: int, model: str, chat: bool, used: dict[str, Any]) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": [], "usage": used}


def model_card(
    model_id: str, created: int, root: str, parent: str | None, max_model_len: int | None, perm_id: str
) -> dict[str, Any]:
    """A /v1/models entry; vLLM sets max_model_len on the base card only; ``perm_id`` is 16 hex digits."""
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{perm_id}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
