"""The sharded adapter set (docs/install.md, "How adapter changes reach the engines"): a large set split
across ``<pool>-adapters-<i>`` under a per-object byte budget, shards before the index that names them
by hash, stable assignment, and no pod roll or Role change when the shard count moves."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from lorapool.api.adapter import AdapterSpec
from lorapool.api.adapterset import (
    CONFIGMAP_KEY,
    INDEX_KEY,
    MAX_SHARDS,
    SHARD_BYTES,
    AdapterSet,
    AdapterSetIndex,
    assemble,
    content_hash,
    read_index,
    shard_of,
)
from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.plan.adapters import PoolAdapter
from lorapool.plan.planner import AdapterRank, Plan, plan_pool
from lorapool.render import names
from lorapool.render.configmaps import AdapterSetTooLarge, adapters_configmaps, shard_leftovers
from lorapool.render.manifests import RenderOptions, render_pool

POOL = "llama3-8b"


def catalogue(n: int, start: int = 0) -> list[PoolAdapter]:
    return [
        PoolAdapter(
            AdapterSpec(name=f"tenant-{i:05d}", source=f"s3://adapters/tenant-{i:05d}/", rank=16),
            "LoRAAdapter",
            f"LoRAAdapter/tenant-{i:05d}",
        )
        for i in range(start, start + n)
    ]


@pytest.fixture
def pool(example_doc: dict[str, Any]) -> LoRAPool:
    example_doc["spec"]["adapters"] = []
    parsed = parse_object(example_doc)
    assert isinstance(parsed, LoRAPool)
    return parsed


def plan_for(pool: LoRAPool, adapters: list[PoolAdapter]) -> Plan:
    return plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in adapters])


def read_back(objects: list[dict[str, Any]]) -> tuple[AdapterSetIndex | None, AdapterSet]:
    """What a reader following the index assembles from ``objects`` (ConfigMaps by name)."""
    data = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    index_data = data[names.adapters_configmap(POOL)]
    index = read_index(index_data)
    shards = {name: d.get(CONFIGMAP_KEY) for name, d in data.items() if name != names.adapters_configmap(POOL)}
    return index, AdapterSet.from_json(assemble(index, index_data, shards))


def test_a_small_set_stays_inline_in_the_index(pool: LoRAPool) -> None:
    adapters = catalogue(3)
    (index_cm,) = adapters_configmaps(pool, plan_for(pool, adapters), adapters)
    assert index_cm["metadata"]["name"] == names.adapters_configmap(POOL)
    index = AdapterSetIndex.from_json(index_cm["data"][INDEX_KEY])
    assert index.shards == () and index.generation == content_hash(index_cm["data"][CONFIGMAP_KEY])
    # Today's readers of adapters.json keep working for every set that fits one object.
    assert [a.name for a in AdapterSet.from_json(index_cm["data"][CONFIGMAP_KEY]).adapters] == [
        "tenant-00000",
        "tenant-00001",
        "tenant-00002",
    ]


def test_a_large_set_splits_across_shards_written_before_the_index(pool: LoRAPool) -> None:
    adapters = catalogue(300)
    budget = 8 * 1024
    objects = adapters_configmaps(pool, plan_for(pool, adapters), adapters, shard_bytes=budget)
    assert objects[-1]["metadata"]["name"] == names.adapters_configmap(POOL)  # the index comes last
    shards = objects[:-1]
    assert len(shards) in (8, 16, 32) and len(shards) & (len(shards) - 1) == 0
    assert [s["metadata"]["name"] for s in shards] == names.adapter_shards(POOL)[: len(shards)]
    assert all(len(s["data"][CONFIGMAP_KEY].encode()) <= budget for s in shards)
    assert CONFIGMAP_KEY not in objects[-1]["data"]  # nothing inline once sharded
    index, whole = read_back(objects)
    assert index is not None and [s.name for s in index.shards] == [s["metadata"]["name"] for s in shards]
    assert sum(s.adapters for s in index.shards) == 300
    assert sorted(a.name for a in whole.adapters) == sorted(a.spec.name for a in adapters)
    assert whole.pool == POOL and whole.max_lora_rank == plan_for(pool, adapters).max_lora_rank


def test_the_default_budget_shards_before_a_configmap_nears_its_limit(pool: LoRAPool) -> None:
    adapters = catalogue(9_000)  # past the 8,530 that broke the single ConfigMap
    objects = adapters_configmaps(pool, plan_for(pool, adapters), adapters)
    sizes = [sum(len(text.encode()) for text in o["data"].values()) for o in objects]
    assert len(objects) > 1 and max(sizes) <= SHARD_BYTES  # the data of each: at most half of the 1 MiB limit
    assert len(read_back(objects)[1].adapters) == 9_000


def test_adding_an_adapter_rewrites_one_shard_and_the_index(pool: LoRAPool) -> None:
    adapters = catalogue(300)
    plan = plan_for(pool, adapters)
    before = adapters_configmaps(pool, plan, adapters, shard_bytes=8 * 1024)
    after = adapters_configmaps(pool, plan, [*adapters, *catalogue(1, start=300)], shard_bytes=8 * 1024)
    assert len(before) == len(after)
    changed = [a["metadata"]["name"] for a, b in zip(after, before, strict=True) if a != b]
    shard = shard_of("tenant-00300", len(after) - 1)
    assert changed == [names.adapter_shard(POOL, shard), names.adapters_configmap(POOL)]


def test_when_the_count_doubles_an_adapter_stays_or_moves_to_its_twin() -> None:
    for count in (2, 4, 8, 16):
        for i in range(500):
            here, there = shard_of(f"a-{i}", count), shard_of(f"a-{i}", 2 * count)
            assert there in (here, here + count)


def test_a_change_of_shard_count_changes_no_pod_template_and_no_role(pool: LoRAPool) -> None:
    few, many = catalogue(100), catalogue(5_000)
    plan = plan_for(pool, many)  # the same plan: only the set (and so its shard count) differs
    opts = RenderOptions(lorapool_image="lorapool:test")
    small, large = render_pool(pool, plan, few, opts), render_pool(pool, plan, many, opts)
    shard_names = set(names.adapter_shards(POOL))
    assert not {o["metadata"]["name"] for o in small} & shard_names
    assert len({o["metadata"]["name"] for o in large} & shard_names) >= 2

    def one(objects: list[dict[str, Any]], kind: str, name: str) -> str:
        return json.dumps(next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name))

    for kind, name in [("Deployment", names.engine(POOL)), ("Role", names.engine_service_account(POOL))]:
        assert one(small, kind, name) == one(large, kind, name)  # byte-identical: no roll, no RBAC write
    kinds = [o["kind"] + "/" + o["metadata"]["name"] for o in large]
    assert kinds.index(f"ConfigMap/{names.adapter_shard(POOL, 0)}") < kinds.index(
        f"ConfigMap/{names.adapters_configmap(POOL)}"
    )


def test_shards_a_smaller_set_leaves_behind_are_named_for_deletion(pool: LoRAPool) -> None:
    adapters = catalogue(300)
    objects = adapters_configmaps(pool, plan_for(pool, adapters), adapters, shard_bytes=8 * 1024)
    used = len(objects) - 1
    assert shard_leftovers(POOL, objects) == names.adapter_shards(POOL)[used:]
    inline = adapters_configmaps(pool, plan_for(pool, adapters[:3]), adapters[:3], shard_bytes=8 * 1024)
    assert shard_leftovers(POOL, inline) == names.adapter_shards(POOL)


def test_a_set_too_large_for_every_shard_says_to_split_the_pool(pool: LoRAPool) -> None:
    adapters = catalogue(200)
    with pytest.raises(AdapterSetTooLarge, match=f"do not fit {MAX_SHARDS} shards of 512 bytes; split them"):
        adapters_configmaps(pool, plan_for(pool, adapters), adapters, shard_bytes=512)


def test_a_set_too_large_for_every_shard_is_a_plan_error_not_a_crash(
    pool: LoRAPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator and `lorapool render` see it as the spec's problem (InvalidPlan, Stalled), with the words."""
    from lorapool.render import desired, manifests

    # 512-byte shards, so 200 adapters overflow all 32 (the real budget would need ~130,000).
    monkeypatch.setattr(manifests, "adapters_configmaps", functools.partial(adapters_configmaps, shard_bytes=512))
    adapters = catalogue(200)
    got = desired.desired_state(pool, [(a, 8) for a in adapters], manifests.RenderOptions())
    assert got.plan is None and not got.objects
    assert "split them across pools" in got.plan_errors[0]
