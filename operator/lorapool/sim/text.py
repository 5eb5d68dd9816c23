"""Deterministic stand-ins for a tokenizer and a sampler. Pure.

Token counts are approximated, not computed with Llama-3's tokenizer (which would need the
tokenizer files and ~100 ms of import): a prompt counts ``ceil(characters / 4)`` tokens, the
usual rule of thumb for English BPE text, at least 1. A chat request adds Llama-3's template:
1 token for ``<|begin_of_text|>``, 5 per message (header tokens, role, ``<|eot_id|>``) and 4 for
the assistant header that opens the reply. Output tokens are words from a fixed list of short
English words (about four characters with the leading space), so the same heuristic counts the
output back to roughly the number of tokens generated.

What a request produces depends only on the server seed, the model name, the request's own
``seed`` and its prompt: same inputs, same text and same length, on every run and every machine
(``hashlib``, never Python's per-process ``hash``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

CHAT_BEGIN_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_REPLY_HEADER_TOKENS = 4

_WORD_LIST = (
    "the of and to in is it for on as was with be by at this are from or had not but "
    "what all were we when your can said there use an each which she do how their if "
    "will up other about out many then them these so some her would make like him into "
    "time has look two more write go see way could people than first water been call "
    "who oil its now find long down day did get come made may part over new sound take "
    "only little work know place year live me back give most very after thing our just "
    "name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small"
)
_WORDS: tuple[str, ...] = tuple(" " + word for word in _WORD_LIST.split())
# Streaming splices output text into pre-rendered JSON: it must never need escaping.
assert all(word[1:].isalpha() and word.isascii() for word in _WORDS)
_MASK64 = (1 << 64) - 1


def count_text_tokens(text: str) -> int:
    """Approximate token count of a prompt: ``ceil(len / 4)``, at least 1."""
    return max(1, (len(text) + 3) // 4)


def message_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ValueError("only text content parts are supported by the simulator")
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError("a text content part needs a string 'text'")
            parts.append(text)
        return "\n".join(parts)
    raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def count_chat_tokens(messages: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """Prompt tokens of a chat request under the Llama-3 template, and the text that seeds it."""
    total = CHAT_BEGIN_TOKENS + CHAT_REPLY_HEADER_TOKENS
    pieces: list[str] = []
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError("every message needs a string 'role'")
        text = message_text(message.get("content"))
        total += CHAT_TOKENS_PER_MESSAGE + (count_text_tokens(text) if text else 0)
        pieces.append(role)
        pieces.append(text)
    return total, "\x1f".join(pieces)


def request_seed(server_seed: int, model: str, prompt: str, seed: int | None) -> int:
    """A 64-bit seed for one request; stable across processes and machines."""
    key = f"{server_seed}\x1f{model}\x1f{'' if seed is None else seed}\x1f{prompt}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def natural_output_tokens(seed: int, low: int, high: int) -> int:
    """Where the simulated model would emit EOS, uniform in ``[low, high]``."""
    return low + (seed >> 11) % (high - low + 1)


def output_text(seed: int, start: int, stop: int) -> str:
    """Text of output tokens ``start`` (inclusive) to ``stop`` (exclusive) of a request."""
    words = _WORDS
    n = len(words)
    out = []
    for i in range(start, stop):
        # splitmix64 of (seed, i): each token is independent of how the stream was chunked.
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append(words[(z ^ (z >> 31)) % n])
    return "".join(out)
