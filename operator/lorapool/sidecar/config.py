"""The sidecar's config: adapters.json parsed, the placement slot read, and what a re-read decides. Pure.

The operator writes the pool's desired set into the ConfigMap ``P-adapters`` (and its shards),
which the shell reads through the API (``setwatch``, a pod) or from a file (dev, tests), and the
pod's slot into a downward-API file. ``parse_config`` and ``parse_slot`` read their text, and
``ConfigFile`` remembers what was applied or refused, so an unchanged file is not parsed again
and a bad one keeps the last good set with a message that says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from lorapool.api.adapterset import AdapterSet, DesiredAdapter


@dataclass(frozen=True)
class ParsedConfig:
    adapters: AdapterSet
    rejected: Mapping[str, str] = field(default_factory=dict)  # name -> why its entry is refused


def parse_config(text: bytes, *, path: str) -> ParsedConfig:
    """Parse adapters.json. A bad document raises ValueError (keep the last good set); a bad
    entry only rejects that adapter, so one typo never blocks the others."""
    try:
        return ParsedConfig(AdapterSet.from_json(text))
    except ValidationError as whole:
        first_error = whole
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"config {path}: not valid JSON ({exc}); fix the ConfigMap or the operator that writes it"
        ) from exc
    entries = raw.get("adapters") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"config {path}: {_first(first_error)}; fix the ConfigMap or the operator that writes it")
    try:
        base = AdapterSet.model_validate({**raw, "adapters": []})
    except ValidationError as exc:
        raise ValueError(f"config {path}: {_first(exc)}; fix the ConfigMap or the operator that writes it") from exc
    good: list[DesiredAdapter] = []
    rejected: dict[str, str] = {}
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        label = str(entry.get("name")) if isinstance(entry, dict) and entry.get("name") else f"adapters[{i}]"
        try:
            adapter = DesiredAdapter.model_validate(entry)
        except ValidationError as exc:
            rejected[label] = f"adapter {label!r}: {_first(exc)}; fix this entry in the pool spec"
            continue
        if adapter.name in seen:
            rejected[label] = f"adapter {label!r}: listed twice; keep one entry per name"
            continue
        seen.add(adapter.name)
        good.append(adapter)
    return ParsedConfig(base.model_copy(update={"adapters": tuple(good)}), rejected)


def parse_slot(text: str | None) -> int | None:
    """This replica's placement slot from the downward-API file of annotation ``lorapool.io/slot``.

    Empty or missing (the operator has not assigned one yet) or unreadable: None, and the
    replica holds only the adapters placed on every replica until its slot arrives.
    """
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


def _first(exc: Any) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "document"
    return f"{where}: {err.get('msg', 'invalid')}"


@dataclass(frozen=True)
class ConfigFile:
    """What the sidecar remembers of its config file between reads."""

    applied: bytes | None = None  # the text last applied
    refused: bytes | None = None  # the text last refused: not parsed again until it changes
    error: str | None = None  # why the last read was refused (shown in /status)

    def forget(self) -> ConfigFile:
        """Apply the next read whatever it holds (SIGHUP, or a new slot changes this replica's share)."""
        return replace(self, applied=None, refused=None)

    def read(self, raw: bytes) -> tuple[ConfigFile, bool]:
        """This memory after reading ``raw``, and whether ``raw`` is new and must be parsed.

        The text last applied, read again, clears an error left by a file that could not be read;
        the text last refused stays refused.
        """
        if raw == self.applied:
            return (replace(self, error=None) if self.refused is None else self), False
        return self, raw != self.refused

    def refuse(self, raw: bytes | None, message: str, *, kept: int | None) -> ConfigFile:
        """``raw`` (None: the file could not be read) refused for ``message``; ``kept``: adapters of the
        last good set, which keeps serving (None: there is none yet)."""
        if kept is not None:
            message = f"{message}; keeping the last good set of {kept} adapters"
        return replace(self, refused=raw, error=message)

    def apply(self, raw: bytes) -> ConfigFile:
        return ConfigFile(applied=raw)
