"""Which kept adapter files to evict (sidecar/keep.py): a pure table; the pool setting that bounds them,
from spec.sidecar.keepUnloaded through the rendered args to the sidecar's flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.api.pool import KeepUnloadedSpec
from lorapool.errors import SpecError
from lorapool.render.common import RenderOptions
from lorapool.render.sidecar import sidecar_container
from lorapool.sidecar.cli import configure
from lorapool.sidecar.keep import Eviction, EvictReason, KeepBudget, evictions

MiB = 1 << 20
NOW = 10_000.0


@dataclass(frozen=True)
class Tree:
    identity: str
    digest: str
    bytes: int
    kept_at: float


def tree(identity: str, mib: int, age_s: float, digest: str | None = None) -> Tree:
    return Tree(identity, digest or f"d-{identity}", mib * MiB, NOW - age_s)


BUDGET = KeepBudget(max_bytes=100 * MiB, max_age_s=3600)
OFF = KeepBudget(max_bytes=0, max_age_s=3600)

CASES = {
    # id: (kept trees, digests in use, budget) -> evicted (identity, reason), oldest first
    "nothing-kept": ([], set(), BUDGET, []),
    "within-budget-keeps-all": ([tree("a", 40, 10), tree("b", 50, 5)], set(), BUDGET, []),
    "exactly-the-budget-keeps-all": ([tree("a", 50, 10), tree("b", 50, 5)], set(), BUDGET, []),
    "past-the-budget-evicts-the-least-recently-used": (
        [tree("new", 60, 5), tree("old", 60, 50)],
        set(),
        BUDGET,
        [("old", EvictReason.BYTES)],
    ),
    "evicts-until-the-rest-fits": (
        [tree("a", 40, 30), tree("b", 40, 20), tree("c", 40, 10), tree("d", 40, 1)],
        set(),
        BUDGET,
        [("a", EvictReason.BYTES), ("b", EvictReason.BYTES)],
    ),
    "one-tree-larger-than-the-budget-goes": ([tree("big", 150, 1)], set(), BUDGET, [("big", EvictReason.BYTES)]),
    "past-max-age-goes-whatever-its-size": (
        [tree("stale", 1, 3601), tree("fresh", 1, 3599)],
        set(),
        BUDGET,
        [("stale", EvictReason.AGE)],
    ),
    "age-first-then-bytes": (
        [tree("stale", 10, 4000), tree("a", 60, 20), tree("b", 60, 10)],
        set(),
        BUDGET,
        [("stale", EvictReason.AGE), ("a", EvictReason.BYTES)],
    ),
    "in-use-is-never-evicted-nor-counted": (
        [tree("used", 90, 9000, digest="shared"), tree("a", 60, 20), tree("b", 30, 10)],
        {"shared"},
        BUDGET,
        [],
    ),
    "off-evicts-every-unused-tree": (
        [tree("a", 1, 1), tree("b", 1, 2, digest="shared")],
        {"shared"},
        OFF,
        [("a", EvictReason.OFF)],
    ),
    "zero-age-is-off": ([tree("a", 1, 0)], set(), KeepBudget(max_bytes=MiB, max_age_s=0), [("a", EvictReason.OFF)]),
    "lru-ties-break-by-identity": (
        [tree("y", 60, 10), tree("x", 60, 10)],
        set(),
        BUDGET,
        [("x", EvictReason.BYTES)],
    ),
}


@pytest.mark.parametrize(("kept", "in_use", "budget", "expected"), CASES.values(), ids=CASES.keys())
def test_evictions(kept: list[Tree], in_use: set[str], budget: KeepBudget, expected: list[tuple[str, str]]) -> None:
    assert evictions(kept, in_use, now=NOW, budget=budget) == [Eviction(i, EvictReason(r)) for i, r in expected]


def test_defaults_are_the_pools() -> None:
    spec = KeepUnloadedSpec()
    assert KeepBudget() == KeepBudget(max_bytes=spec.max_bytes, max_age_s=spec.max_age_seconds)
    assert KeepBudget().on


def _pool_doc(keep: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": "p"},
        "spec": {
            "baseModel": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": "hf://meta-llama/x"},
            "gpu": {"product": "L40S"},
            "sidecar": {"keepUnloaded": keep},
        },
    }


@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        ({}, KeepBudget()),
        ({"maxBytes": 0}, KeepBudget(max_bytes=0)),
        ({"maxBytes": 5 << 20, "maxAgeSeconds": 60}, KeepBudget(max_bytes=5 << 20, max_age_s=60.0)),
    ],
    ids=["default", "off", "set"],
)
def test_the_pool_setting_reaches_the_sidecar_flags(keep: dict[str, int], expected: KeepBudget) -> None:
    pool = parse_object(_pool_doc(keep))
    assert isinstance(pool, LoRAPool)
    args = sidecar_container(pool, RenderOptions(lorapool_image="lorapool:test"), [])["args"]
    parser = argparse.ArgumentParser()
    configure(parser)
    parsed = parser.parse_args(args[1:])  # the sidecar's own parser reads what the operator renders
    assert KeepBudget(max_bytes=parsed.keep_unloaded_bytes, max_age_s=parsed.keep_unloaded_max_age) == expected


@pytest.mark.parametrize(
    ("keep", "says"),
    [
        ({"maxBytes": -1}, "spec.sidecar.keepUnloaded.maxBytes: must be >= 0 (got -1)"),
        ({"maxBytes": 1 << 41}, "spec.sidecar.keepUnloaded.maxBytes: must be <= 1099511627776"),
        ({"maxAgeSeconds": 0}, "spec.sidecar.keepUnloaded.maxAgeSeconds: must be >= 1 (got 0)"),
    ],
    ids=["negative-bytes", "bytes-past-1Ti", "zero-age"],
)
def test_bad_settings_name_the_field(keep: dict[str, int], says: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_object(_pool_doc(keep))
    assert says in str(err.value)
