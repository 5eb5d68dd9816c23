"""How many tokens a response used, as the router relays it. Pure.

For token limits (``core.ratelimit``): the engine's own ``usage`` when the response carries it
(a JSON body always does; a stream only with ``stream_options.include_usage``), else the prompt
estimate plus what was streamed, one token per streamed choice delta (vLLM sends one event per
generated token unless ``--stream-interval`` batches them: then this under-counts, never over).
Only responses of token-limited adapters are metered, so other traffic pays nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# A stream line longer than this is not an event we can read (the buffer stays bounded).
MAX_LINE_BYTES = 1 << 20


@dataclass
class UsageMeter:
    """Feed it a response's bytes as they are relayed; ``total`` says the tokens it used."""

    prompt_tokens: int  # the router's estimate, for when the engine reports no usage
    stream: bool
    reported: int | None = None  # usage.total_tokens, once seen
    reported_completion: int | None = None  # usage.completion_tokens, once seen
    streamed: int = 0  # choice deltas with content seen in the stream
    fed: int = 0  # response bytes seen (0: the body never passed here, so nothing is known)
    _partial: bytearray = field(default_factory=bytearray)
    _body: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> None:
        self.fed += len(chunk)
        if not self.stream:
            if len(self._body) + len(chunk) <= MAX_LINE_BYTES:
                self._body += chunk
            return
        self._partial += chunk
        *lines, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest if len(rest) <= MAX_LINE_BYTES else b"")
        for line in lines:
            if line.startswith(b"data:"):
                self._event(bytes(line[5:].strip()))

    def _event(self, data: bytes) -> None:
        if not data or data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return
        if not isinstance(event, dict):
            return
        if (total := _total_tokens(event)) is not None:
            self.reported = total
            self.reported_completion = _usage_field(event, "completion_tokens")
        choices = event.get("choices")
        if isinstance(choices, list):
            self.streamed += sum(1 for c in choices if isinstance(c, dict) and _has_content(c))

    def total(self) -> int:
        """Prompt + completion tokens: the engine's word when it gave one, else the estimate."""
        return sum(self.split())

    def split(self) -> tuple[int, int]:
        """(prompt, completion) tokens: the engine's usage when it gave one, else the prompt estimate
        and what was streamed (a usage without the split counts all of it as prompt)."""
        if not self.stream and self._body:
            try:
                body = json.loads(self._body)
            except (UnicodeDecodeError, json.JSONDecodeError):
                body = None
            if isinstance(body, dict) and (total := _total_tokens(body)) is not None:
                return _split(total, _usage_field(body, "completion_tokens"))
        if self.reported is not None:
            return _split(self.reported, self.reported_completion)
        return self.prompt_tokens, self.streamed


def _total_tokens(payload: dict[str, Any]) -> int | None:
    return _usage_field(payload, "total_tokens")


def _usage_field(payload: dict[str, Any], name: str) -> int | None:
    usage = payload.get("usage")
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _split(total: int, completion: int | None) -> tuple[int, int]:
    completion = min(completion, total) if completion is not None else 0
    return total - completion, completion


def _has_content(choice: dict[str, Any]) -> bool:
    """A streamed choice that carries generated text (completions ``text``, chat ``delta.content``)."""
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and bool(delta.get("content") or delta.get("reasoning_content"))
