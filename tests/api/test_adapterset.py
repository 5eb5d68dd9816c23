"""The adapter set's wire format between the operator and the sidecars: the index of ``<pool>-adapters``
and its shards (``lorapool.api.adapterset``). A bad index is refused with a message naming the field;
an index and shards that do not agree (yet) are never assembled into a set."""

from __future__ import annotations

import json
import re

import pytest

from lorapool.api.adapterset import (
    CONFIGMAP_KEY,
    INDEX_KEY,
    MAX_SHARDS,
    AdapterSet,
    AdapterSetIndex,
    DesiredAdapter,
    InconsistentSet,
    ShardRef,
    assemble,
    content_hash,
    read_index,
)

WHOLE = AdapterSet(
    pool="p",
    base_model="m",
    max_lora_rank=16,
    adapters=(DesiredAdapter(name="a", source="hf://org/a"), DesiredAdapter(name="b", source="hf://org/b")),
)


def sharded() -> tuple[AdapterSetIndex, dict[str, str], dict[str, str | None]]:
    parts = [WHOLE.model_copy(update={"adapters": (a,)}).to_json() for a in WHOLE.adapters]
    index = AdapterSetIndex(
        pool="p",
        generation=content_hash(WHOLE.to_json()),
        shards=tuple(ShardRef(name=f"p-adapters-{i}", sha256=content_hash(t), adapters=1) for i, t in enumerate(parts)),
    )
    return index, {INDEX_KEY: index.to_json()}, {f"p-adapters-{i}": t for i, t in enumerate(parts)}


def test_the_index_round_trips_in_its_wire_spelling() -> None:
    index, data, _ = sharded()
    doc = json.loads(data[INDEX_KEY])
    assert doc["apiVersion"] == "lorapool.io/v1alpha1" and doc["kind"] == "AdapterSetIndex"
    assert doc["shards"][0] == {"name": "p-adapters-0", "sha256": index.shards[0].sha256, "adapters": 1}
    assert AdapterSetIndex.from_json(data[INDEX_KEY]) == index


def test_a_consistent_sharded_set_assembles_into_the_whole_set() -> None:
    _, data, shards = sharded()
    whole = AdapterSet.from_json(assemble(read_index(data), data, shards))
    assert whole == WHOLE


def test_an_inline_set_and_a_set_written_before_the_index_existed_read_as_they_are() -> None:
    text = WHOLE.to_json()
    index = AdapterSetIndex(pool="p", generation=content_hash(text))
    data = {INDEX_KEY: index.to_json(), CONFIGMAP_KEY: text}
    assert assemble(read_index(data), data, {}) == text.encode()
    assert read_index({CONFIGMAP_KEY: text}) is None
    assert assemble(None, {CONFIGMAP_KEY: text}, {}) == text.encode()


def test_a_half_written_update_is_never_assembled() -> None:
    index, data, shards = sharded()
    stale = {**shards, "p-adapters-1": WHOLE.model_copy(update={"adapters": ()}).to_json()}
    with pytest.raises(InconsistentSet, match="shard p-adapters-1 does not match generation"):
        assemble(index, data, stale)
    with pytest.raises(InconsistentSet, match=r"shard p-adapters-0 of generation .* is missing"):
        assemble(index, data, {**shards, "p-adapters-0": None})
    inline = AdapterSetIndex(pool="p", generation=content_hash(WHOLE.to_json()))
    other = WHOLE.model_copy(update={"adapters": ()}).to_json()
    with pytest.raises(InconsistentSet, match=r"inline adapters.json does not match"):
        assemble(inline, {CONFIGMAP_KEY: other}, {})
    with pytest.raises(InconsistentSet, match=r"adapters.json is missing"):
        assemble(inline, {INDEX_KEY: inline.to_json()}, {})


def test_shards_that_disagree_on_the_pool_are_refused() -> None:
    _, _, shards = sharded()
    alien = WHOLE.model_copy(update={"adapters": WHOLE.adapters[1:], "max_lora_rank": 64}).to_json()
    index = AdapterSetIndex(
        pool="p",
        generation=content_hash("x"),
        shards=(
            ShardRef(name="p-adapters-0", sha256=content_hash(shards["p-adapters-0"] or ""), adapters=1),
            ShardRef(name="p-adapters-1", sha256=content_hash(alien), adapters=1),
        ),
    )
    with pytest.raises(ValueError, match="shard p-adapters-1: its pool, base model or rank differs"):
        assemble(index, {}, {**shards, "p-adapters-1": alien})
    not_a_set = '["a"]'
    index = AdapterSetIndex(
        pool="p",
        generation=content_hash("x"),
        shards=(ShardRef(name="p-adapters-0", sha256=content_hash(not_a_set), adapters=1),),
    )
    with pytest.raises(ValueError, match="shard p-adapters-0: not an AdapterSet document"):
        assemble(index, {}, {"p-adapters-0": not_a_set})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"generation": "not-a-hash"}, "generation"),
        ({"kind": "AdapterSet"}, "kind"),
        ({"extra": 1}, "extra"),
        ({"shards": [{"name": "Bad_Name", "sha256": "0" * 64, "adapters": 1}]}, "shards.0.name"),
        ({"shards": [{"name": "s", "sha256": "0" * 64, "adapters": -1}]}, "shards.0.adapters"),
        ({"shards": [{"name": "s", "sha256": "0" * 64, "adapters": 1}] * 2}, "a shard is named twice"),
        (
            {"shards": [{"name": f"s-{i}", "sha256": "0" * 64, "adapters": 1} for i in range(MAX_SHARDS + 1)]},
            "shards",
        ),
    ],
)
def test_a_bad_index_is_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    good = json.loads(AdapterSetIndex(pool="p", generation="0" * 64).to_json())
    with pytest.raises(ValueError, match=rf"index.json: .*{re.escape(field)}.*; the operator writes this index"):
        read_index({INDEX_KEY: json.dumps({**good, **change})})


def test_an_index_configmap_with_neither_key_or_bad_json_is_refused() -> None:
    with pytest.raises(ValueError, match=r"neither index.json nor adapters.json"):
        read_index({})
    with pytest.raises(ValueError, match=r"index.json: "):
        read_index({INDEX_KEY: "{not json"})
