"""YAML in and out, the same way everywhere (CRDs, rendered manifests, examples). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Block style, insertion order, no anchors: output a human can read and diff."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def dump_all(objs: Iterable[Any]) -> str:
    return yaml.dump_all(list(objs), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def load_all(text: str) -> list[Any]:
    """Every non-empty document in a YAML stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
