"""Parse user YAML into API objects with one clear line per problem. Pure.

Pydantic's errors are rewritten as ``<path>: <problem>`` using the wire (camelCase)
field names a user typed, e.g. ``spec.adapters[1].rank: must be <= 512 (got 600)``, every
problem of a document at once, never a regular expression (string rules carry their own
words: ``lorapool.api.common.Check``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from lorapool.api.models import API_VERSION, LoRAAdapter, LoRAPool, LoRAPoolSpec
from lorapool.errors import SpecError

KINDS: dict[str, type[LoRAPool] | type[LoRAAdapter]] = {"LoRAPool": LoRAPool, "LoRAAdapter": LoRAAdapter}
_MODELS_BY_TITLE: dict[str, type[BaseModel]] = {m.__name__: m for m in (LoRAPool, LoRAAdapter, LoRAPoolSpec)}


def describe(error: ValidationError, *, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """One ``path: message`` line per pydantic error, in the user's field names and words.

    pydantic's wording ("Input should be ...") becomes "must be ..."; the value given is shown;
    a field with ``examples`` adds a valid one ("e.g. 16") where the message has none. ``model``
    is the class validated (found from the error's title when not given).
    """
    root = model or _MODELS_BY_TITLE.get(error.title)
    lines = []
    for item in error.errors(include_url=False):
        loc = [part for part in item["loc"] if not _is_union_branch(part)]
        path = ""
        for part in loc:
            path += f"[{part}]" if isinstance(part, int) else ("." if path else "") + str(part)
        lines.append(f"{prefix}{path}: {_message(item, _example(root, loc))}")
    return _dedupe(lines)


def _is_union_branch(part: object) -> bool:
    """pydantic names the branches of a union in the location (``int``, ``literal['auto']``): noise to a user."""
    return isinstance(part, str) and (part in ("int", "str", "float") or "[" in part or "(" in part)


_REWORDED = (
    ("Input should be less than or equal to ", "must be <= "),
    ("Input should be greater than or equal to ", "must be >= "),
    ("Input should be less than ", "must be < "),
    ("Input should be greater than ", "must be > "),
    ("Input should be a valid integer, unable to parse string as an integer", "must be an integer"),
    ("Input should be a valid integer, got a number with a fractional part", "must be a whole number"),
    ("Input should be a valid integer", "must be an integer"),
    ("Input should be a valid number, unable to parse string as a number", "must be a number"),
    ("Input should be a valid number", "must be a number"),
    ("Input should be a valid string", "must be a string"),
    ("Input should be a valid boolean", "must be true or false"),
    ("Input should be a valid list", "must be a list"),
    ("Input should be a valid dictionary or instance of", "must be a mapping of fields, e.g. {name: ...}; not a"),
    ("Input should be ", "must be "),
    ("String should have at most ", "must have at most "),
    ("String should have at least ", "must have at least "),
    ("List should have at most ", "must have at most "),
    ("Value error, ", ""),
    ("Assertion failed, ", ""),
)


# Errors whose message already shows a valid value (a bound, the allowed values) or says its own.
_EXAMPLE_NEEDLESS = frozenset(
    {
        "value_error",
        "checked",
        "duplicate_name",
        "less_than_equal",
        "greater_than_equal",
        "less_than",
        "greater_than",
        "literal_error",
        "enum",
        "string_too_long",
        "string_too_short",
        "too_long",
        "too_short",
    }
)


def _message(item: Mapping[str, Any], example: str | None) -> str:
    kind = item["type"]
    if kind == "extra_forbidden":
        return "unknown field; check the spelling (kubectl explain lorapool.spec)"
    if kind == "missing":
        return "required" + (f", e.g. {example}" if example else "")
    message = str(item["msg"])
    for old, new in _REWORDED:
        if message.startswith(old):
            message = new + message[len(old) :]
            break
    if example and "e.g." not in message and kind not in _EXAMPLE_NEEDLESS:
        message += f", e.g. {example}"
    value = item.get("input")
    if kind not in ("value_error", "checked", "duplicate_name") and not isinstance(value, dict | list):
        message += f" (got {value!r})"
    return message


def _example(model: type[BaseModel] | None, loc: Sequence[Any]) -> str | None:
    """The first of ``examples`` on the field at ``loc`` (wire names), walking nested models and lists."""
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias, f.validation_alias)), None)
        if field is None:
            return None
        model = _model_in(field.annotation)
    if field is None or not field.examples:
        return None
    return str(field.examples[0])


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


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
