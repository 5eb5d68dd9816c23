"""Model dimensions: a built-in table of common base models, and parsing of config.json. Pure.

The planner needs a model's shape to size LoRA buffers and the KV cache. Lookup order
(the caller decides): ``spec.baseModel.architecture`` > the model's ``config.json``
when the operator could read it > this table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelDims:
    """The numbers vLLM's memory use depends on (names as in HF config.json)."""

    key: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_parameters: int
    max_position_embeddings: int
    embedding_lora: bool = True  # Llama-style models get embedding LoRA buffers in vLLM


def _dims(
    key: str,
    h: int,
    i: int,
    n: int,
    heads: int,
    kv: int,
    vocab: int,
    params: float,
    ctx: int,
    head_dim: int | None = None,
) -> ModelDims:
    return ModelDims(key, h, i, n, heads, kv, head_dim or h // heads, vocab, round(params * 1e9), ctx)


# Values from each model's config.json on the Hugging Face Hub; parameters from the model cards.
KNOWN_MODELS: dict[str, ModelDims] = {
    d.key: d
    for d in (
        _dims("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8.03, 8192),
        _dims("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128256, 8.03, 131072),
        _dims("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 70.55, 8192),
        _dims("llama-3.1-70b", 8192, 28672, 80, 64, 8, 128256, 70.55, 131072),
        _dims("llama-3.2-1b", 2048, 8192, 16, 32, 8, 128256, 1.24, 131072, head_dim=64),
        _dims("llama-3.2-3b", 3072, 8192, 28, 24, 8, 128256, 3.21, 131072),
        _dims("mistral-7b", 4096, 14336, 32, 32, 8, 32768, 7.25, 32768),
        _dims("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 7.62, 32768),
        _dims("qwen2.5-14b", 5120, 13824, 48, 40, 8, 152064, 14.77, 32768),
        _dims("qwen2.5-32b", 5120, 27648, 64, 40, 8, 152064, 32.76, 32768),
        _dims("qwen2.5-72b", 8192, 29568, 80, 64, 8, 152064, 72.71, 32768),
    )
}

# Name patterns (matched against the lowercased model name, then its source) -> table key.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"llama-?3\.1-8b", "llama-3.1-8b"),
    (r"llama-?3-8b", "llama-3-8b"),
    (r"llama-?3\.[13]-70b", "llama-3.1-70b"),
    (r"llama-?3-70b", "llama-3-70b"),
    (r"llama-?3\.2-1b", "llama-3.2-1b"),
    (r"llama-?3\.2-3b", "llama-3.2-3b"),
    (r"mistral-7b", "mistral-7b"),
    (r"qwen2\.5-7b", "qwen2.5-7b"),
    (r"qwen2\.5-14b", "qwen2.5-14b"),
    (r"qwen2\.5-32b", "qwen2.5-32b"),
    (r"qwen2\.5-72b", "qwen2.5-72b"),
)


def lookup_model(*names: str | None) -> ModelDims | None:
    """The table entry whose pattern matches the first of ``names`` that matches any."""
    for name in names:
        if not name:
            continue
        lowered = name.lower()
        for pattern, key in _PATTERNS:
            if re.search(pattern, lowered):
                return KNOWN_MODELS[key]
    return None


def dims_from_config(
    config: Mapping[str, Any], *, key: str = "config.json", num_parameters: int | None = None
) -> ModelDims:
    """Dims from a HF ``config.json``. Parameters are estimated from the shapes when not given."""
    try:
        h = int(config["hidden_size"])
        i = int(config["intermediate_size"])
        n = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv = int(config.get("num_key_value_heads") or heads)
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{key}: missing or invalid {exc}; set spec.baseModel.architecture instead") from exc
    head_dim = int(config.get("head_dim") or h // heads)
    ctx = int(config.get("max_position_embeddings") or 8192)
    if num_parameters is None:
        attention = h * heads * head_dim * 2 + h * kv * head_dim * 2
        tied = bool(config.get("tie_word_embeddings", False))
        num_parameters = n * (attention + 3 * h * i + 2 * h) + vocab * h * (1 if tied else 2) + h
    return ModelDims(key, h, i, n, heads, kv, head_dim, vocab, num_parameters, ctx)
