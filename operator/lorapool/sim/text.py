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

For the prefix cache a prompt becomes its *cache text*, exactly ``CHARS_PER_TOKEN`` characters
per estimated token, so a KV block of ``block_size`` tokens is ``block_size x 4`` characters of it:
a completion prompt padded to a multiple of 4, a token-id prompt 4 characters per id, a chat
request the Llama-3 template rendered with one 4-character stand-in per special token, each
message's text padded. Messages render in order, so a conversation that resends its history
shares the cache text, and the blocks, of its earlier turn. ``block_hashes`` chains the full
blocks' hashes as vLLM 0.32's ``hash_block_tokens`` (``vllm/v1/core/kv_cache_utils.py``) does over
token ids: parent hash, block content, extra keys (``lora_salt``).
"""

from __future__ import annotations

import hashlib
import struct
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
CHARS_PER_TOKEN = 4
_PAD = "\x00"  # fills a text to whole tokens; never a character of its own
# Llama-3's special tokens, 4 characters each: <|begin_of_text|>, the header tokens, <|eot_id|>
_BOS, _START_HEADER, _END_HEADER, _EOT = "\x01bos", "\x01sh\x01", "\x01eh\x01", "\x01eo\x01"
_HEADER_NEWLINES = "\n\n" + _PAD * 2  # the "\n\n" token after a header


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


def text_cache_text(text: str) -> str:
    """A completion prompt as the prefix cache sees it: 4 characters per estimated token."""
    return _padded(text)


def token_ids_cache_text(token_ids: Sequence[int]) -> str:
    """A token-id prompt as the prefix cache sees it: each id as 4 characters (its 32 bits)."""
    return struct.pack(f"<{len(token_ids)}I", *(t & 0xFFFFFFFF for t in token_ids)).decode("latin-1")


def chat_cache_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """A chat request as the Llama-3 template renders it, 4 characters per token of the estimate
    ``count_chat_tokens`` makes (so ``len == 4 x`` its count); ends with the assistant header."""
    parts = [_BOS]
    for message in messages:
        parts.append(_header(str(message.get("role"))))
        parts.append(_padded(message_text(message.get("content"))))
        parts.append(_EOT)
    parts.append(_header("assistant"))
    return "".join(parts)


def lora_salt(name: str, path: str) -> str:
    """The prefix-cache salt of an adapter: vLLM 0.32 and 0.34 key its blocks on ("lora", name,
    path), so another adapter, or the same name loaded from another path (a hot swap), misses."""
    return f"lora\x00{name}\x00{path}"


def block_hashes(cache_text: str, block_size: int, salt: str = "") -> tuple[int, ...]:
    """Chained 64-bit hashes of the full blocks of a prompt's cache text, salted (base model: "").

    Block i's hash covers block i-1's hash and block i's characters, so equal hashes mean equal
    prefixes under the same salt; the salt seeds the chain as vLLM's extra keys enter every block."""
    block_chars = block_size * CHARS_PER_TOKEN
    parent = hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    out = []
    for start in range(0, len(cache_text) - block_chars + 1, block_chars):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(cache_text[start : start + block_chars].encode("utf-8", "surrogatepass"))
        parent = digest.digest()
        out.append(int.from_bytes(parent[:8], "little"))
    return tuple(out)


def _padded(text: str) -> str:
    return text + _PAD * (-len(text) % CHARS_PER_TOKEN)


def _header(role: str) -> str:
    """<|start_header_id|> role <|end_header_id|> "\n\n": 4 tokens, the role as 4 hex digits of its hash."""
    role_token = hashlib.blake2b(role.encode("utf-8", "surrogatepass"), digest_size=2).hexdigest()
    return _START_HEADER + role_token + _END_HEADER + _HEADER_NEWLINES


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
