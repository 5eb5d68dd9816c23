"""Parse user YAML into API objects with one clear line per problem. Pure.

Pydantic's errors are rewritten as ``<path>: <problem>`` using the wire (camelCase)
field names a user typed, e.g. ``spec.adapters[1].rank: must be <= 512 (got 600)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from lorapool.api.models import API_VERSION, LoRAAdapter, LoRAPool
from lorapool.errors import SpecError

KINDS: dict[str, type[LoRAPool] | type[LoRAAdapter]] = {"LoRAPool": LoRAPool, "LoRAAdapter": LoRAAdapter}


def describe(error: ValidationError, *, prefix: str = "") -> list[str]:
    """One ``path: message`` line per pydantic error, in the user's field names."""
    lines = []
    for item in error.errors(include_url=False):
        path = prefix
        for part in item["loc"]:
            if isinstance(part, int):
                path += f"[{part}]"
            elif part in ("int", "literal['auto']", "function-after[_positive(), int]"):
                continue  # union branch names are noise to a user
            else:
                path += ("." if path else "") + str(part)
        message = item["msg"]
        for noise in ("Value error, ", "Assertion failed, "):
            message = message.replace(noise, "")
        if item["type"] == "extra_forbidden":
            message = "unknown field; check the spelling (kubectl explain lorapool.spec)"
        elif (
            "input" in item
            and item["type"] not in ("missing", "value_error")
            and not isinstance(item["input"], dict | list)
        ):
            message += f" (got {item['input']!r})"
        lines.append(f"{path}: {message}")
    return _dedupe(lines)


def _dedupe(lines: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for line in lines:
        seen.setdefault(line, None)
    return list(seen)


def parse_object(doc: Mapping[str, Any], *, where: str = "") -> LoRAPool | LoRAAdapter:
    """A LoRAPool or LoRAAdapter from a dict; SpecError listing every problem."""
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where or 'document'}: expected a Kubernetes object (a mapping), got {type(doc).__name__}")
    kind = doc.get("kind")
    if kind not in KINDS:
        raise SpecError(f"{where}kind: {kind!r} is not a lorapool kind; use LoRAPool or LoRAAdapter")
    if doc.get("apiVersion") != API_VERSION:
        raise SpecError(f"{where}apiVersion: {doc.get('apiVersion')!r} is not served; use {API_VERSION}")
    try:
        return KINDS[kind].model_validate(doc)
    except ValidationError as exc:
        raise SpecError(describe(exc, prefix=where)) from None
