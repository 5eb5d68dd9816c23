"""Shared by the offline commands (plan, render): read YAML files, print problems."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.api.yamlio import load_all
from lorapool.errors import LoRAPoolError, SpecError
from lorapool.plan.adapters import Merged, merge_adapters, unattached
from lorapool.plan.planner import AdapterRank, Plan, plan_pool


@dataclass(frozen=True)
class Inputs:
    pools: tuple[LoRAPool, ...]
    adapters: tuple[LoRAAdapter, ...]


def read_inputs(paths: list[str]) -> Inputs:
    """Every LoRAPool and LoRAAdapter in the files ('-' is stdin); SpecError lists all problems."""
    pools: list[LoRAPool] = []
    adapters: list[LoRAAdapter] = []
    problems: list[str] = []
    for path in paths:
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text()
        except OSError as exc:
            raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
        try:
            docs = load_all(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: not valid YAML: {exc}") from None
        for index, doc in enumerate(docs):
            if isinstance(doc, dict) and doc.get("kind") not in ("LoRAPool", "LoRAAdapter"):
                continue  # other objects in a kustomization are not ours
            where = f"{path}" + (f" (document {index + 1})" if len(docs) > 1 else "") + ": "
            try:
                obj = parse_object(doc, where=where)
            except SpecError as exc:
                problems.extend(exc.problems)
                continue
            if isinstance(obj, LoRAPool):
                pools.append(obj)
            else:
                adapters.append(obj)
    if not pools and not problems:
        raise SpecError(f"{', '.join(paths)}: no LoRAPool found; the file needs kind: LoRAPool")
    problems += unattached(pools, adapters) if pools else []
    if problems:
        raise SpecError(problems)
    return Inputs(tuple(pools), tuple(adapters))


def plan_offline(pool: LoRAPool, adapters: tuple[LoRAAdapter, ...]) -> tuple[Plan, Merged]:
    """Plan with the ranks written in the spec (offline: sources are not read)."""
    merged = merge_adapters(pool, adapters)
    ranks = [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters]
    return plan_pool(pool.spec, ranks), merged


def fail(error: LoRAPoolError, command: str) -> int:
    problems = error.problems if isinstance(error, SpecError) else (str(error),)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"lorapool {command}: {len(problems)} problem(s); nothing was printed", file=sys.stderr)
    return 1
