"""JSON merge patches (RFC 7386) as the status writes use them. Pure.

A merge patch merges objects key by key and keeps every key it does not mention, so a key that left
a nested map (a phase whose count fell to zero in ``status.adapterPhases``, an optional field of
``status.plan``) stays on the server for ever unless the patch names it with null. And a writer that
compares what it wants with what is stored then sees a difference on every pass and writes the same
patch again: an operator restarted at 10,000 adapters rewrote its pool's status three times.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def with_removals(current: Any, desired: Any) -> Any:
    """``desired`` with null for each key ``current`` has in a nested object and ``desired`` lacks."""
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return desired
    out = {key: with_removals(current.get(key), value) for key, value in desired.items()}
    out.update({key: None for key in current if key not in desired})
    return out


def patch_of(current: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that makes each of ``fields`` (top-level keys) equal to its value; the keys it
    does not name are another writer's and stay as they are."""
    return {key: with_removals(current.get(key), value) for key, value in fields.items()}


def apply(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` after ``patch`` as the API server applies it: null removes, objects merge, the rest replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            current = out.get(key)
            out[key] = apply(current if isinstance(current, Mapping) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out
