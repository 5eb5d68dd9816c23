"""Merge a pool's inline adapters with LoRAAdapter objects that point at it. Pure.

Inline adapters belong to the platform team and win a name clash; the clashing
LoRAAdapter is reported as a conflict (a condition on it), never silently dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lorapool.api.models import AdapterSpec, LoRAAdapter, LoRAPool


@dataclass(frozen=True)
class PoolAdapter:
    """One adapter the pool serves, with where it was declared."""

    spec: AdapterSpec
    origin: str  # "Inline" or "LoRAAdapter"
    field: str  # the path an error should name


@dataclass(frozen=True)
class Merged:
    adapters: tuple[PoolAdapter, ...]
    conflicts: tuple[tuple[str, str], ...]  # (LoRAAdapter name, message)


def merge_adapters(pool: LoRAPool, objects: Sequence[LoRAAdapter]) -> Merged:
    """Inline adapters first (in spec order), then LoRAAdapters by name; clashes refused."""
    merged = [PoolAdapter(a, "Inline", f"spec.adapters[{i}]") for i, a in enumerate(pool.spec.adapters)]
    taken = {a.name for a in pool.spec.adapters}
    conflicts: list[tuple[str, str]] = []
    mine = [
        o
        for o in objects
        if o.spec.pool_ref.name == pool.metadata.name and o.metadata.namespace == pool.metadata.namespace
    ]
    for obj in sorted(mine, key=lambda o: o.metadata.name):
        name = obj.metadata.name
        if name in taken:
            conflicts.append(
                (
                    name,
                    f"pool {pool.metadata.name} already declares adapter {name!r} inline; rename this LoRAAdapter "
                    "or remove the inline entry",
                )
            )
            continue
        taken.add(name)
        merged.append(PoolAdapter(obj.as_adapter(), "LoRAAdapter", f"LoRAAdapter {obj.metadata.namespace}/{name}"))
    return Merged(tuple(merged), tuple(conflicts))


def unattached(pools: Sequence[LoRAPool], objects: Sequence[LoRAAdapter]) -> list[str]:
    """One problem per LoRAAdapter whose spec.poolRef names no pool among ``pools`` (same namespace).

    Offline (`lorapool plan|render`), such an adapter would silently render nowhere.
    """
    present = {(p.metadata.namespace, p.metadata.name) for p in pools}
    given = ", ".join(sorted(f"{ns}/{name}" for ns, name in present)) or "none"
    return [
        f"LoRAAdapter {o.metadata.namespace}/{o.metadata.name}: spec.poolRef.name: no LoRAPool "
        f"{o.spec.pool_ref.name} in namespace {o.metadata.namespace} among the files given (LoRAPools: {given}); "
        "fix spec.poolRef.name or add the pool's file with -f"
        for o in objects
        if (o.metadata.namespace, o.spec.pool_ref.name) not in present
    ]
