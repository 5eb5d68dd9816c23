"""The bad-input corpus (cases.yaml) as data: each case's documents, and what a refusal must say.

Shared by tests/corpus/test_corpus.py (the CLI) and tests/controller/test_corpus.py (the API
server and the operator), so the three layers are tested with the same inputs.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from lorapool_dev.testing.peft import write_peft_adapter

HERE = Path(__file__).parent
REPO = HERE.parents[1]
EXAMPLE = REPO / "examples" / "lorapool.yaml"
ACCEPTED = "accepted"

# What only a regular expression prints; no refusal may contain any of them.
REGEX_SIGNS = ("should match pattern", "^(", "[a-z", "[A-Za-z", "\\s", "{1,", ".*)", "[^")


def adapter_doc(namespace: str) -> dict[str, Any]:
    """A valid LoRAAdapter for the example pool; the cases with ``target: adapter`` edit it."""
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": "legal", "namespace": namespace},
        "spec": {"poolRef": {"name": "llama3-8b"}, "source": "hf://acme/llama3-legal-lora", "rank": 8},
    }


@dataclass(frozen=True)
class Case:
    id: str
    set: Mapping[str, Any]
    field: str
    says: str
    target: str = "pool"
    also: tuple[str, ...] = ()
    cli: str = "refused"
    apiserver: str = ACCEPTED
    apiserver_field: str | None = None
    operator: str | None = None
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def refused_offline(self) -> bool:
        return self.cli != ACCEPTED

    @property
    def refused_at_apply(self) -> bool:
        return self.apiserver != ACCEPTED

    def documents(self, namespace: str = "ml", files_dir: Path | None = None) -> list[dict[str, Any]]:
        """The pool (and, for adapter cases, the adapter) with this case's mistake in it."""
        pool = yaml.safe_load(EXAMPLE.read_text())
        pool["metadata"]["namespace"] = namespace
        docs = [pool] if self.target == "pool" else [pool, adapter_doc(namespace)]
        paths = self._write_files(files_dir) if self.files else {}
        for path, value in self.set.items():
            set_path(docs[-1], path, _fill(copy.deepcopy(value), paths))
        return docs

    def _write_files(self, files_dir: Path | None) -> dict[str, str]:
        assert files_dir is not None, f"{self.id} writes adapters: pass files_dir"
        return {
            name: str(write_peft_adapter(files_dir / name, **dict(config)))  # type: ignore[arg-type]
            for name, config in self.files.items()
        }

    def yaml(self, namespace: str = "ml", files_dir: Path | None = None) -> str:
        return yaml.safe_dump_all(self.documents(namespace, files_dir), sort_keys=False)


def _fill(value: Any, paths: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**paths) if paths else value
    if isinstance(value, dict):
        return {k: _fill(v, paths) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, paths) for v in value]
    return value


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``spec.adapters[0].source``-style paths; intermediate mappings are created, index len appends."""
    parts: list[str | int] = [int(i) if i else key for key, i in _TOKEN.findall(path)]
    node: Any = doc
    for part, following in pairwise(parts):
        node = node[part] if isinstance(part, int) else node.setdefault(part, [] if isinstance(following, int) else {})
    last = parts[-1]
    if isinstance(last, int) and last == len(node):
        node.append(value)
    else:
        node[last] = value


def load_cases() -> list[Case]:
    raw = yaml.safe_load((HERE / "cases.yaml").read_text())["cases"]
    return [Case(**{**c, "also": tuple(c.get("also", ()))}) for c in raw]


CASES = load_cases()


def regex_in(text: str) -> list[str]:
    return [sign for sign in REGEX_SIGNS if sign in text]
