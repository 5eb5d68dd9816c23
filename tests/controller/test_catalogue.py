"""The operator at catalogue scale (issue 44): a bounded pool status, reads from a watch-fed index, writes
only on change under a rate limit, Events aggregated, a config cache sized by the catalogue.

The pure parts are tested as functions; the reconcile runs for real over an in-memory API (``Api``
below) that counts every call, with 2,000 LoRAAdapters of which 50 are bad. The API server's own
refusal of an oversized object is tested against a real kube-apiserver in test_write_failures_cluster.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections import Counter
from dataclasses import replace
from typing import Any, cast

import pytest

from lorapool.api import mergepatch
from lorapool.api.status import AdapterPhase, LoRAPoolStatus
from lorapool.controller.index import AdapterIndex
from lorapool.controller.reconcile import PoolReconciler, Settings
from lorapool.controller.status import (
    MAX_LISTED_OBJECTS,
    MAX_WORST,
    AdapterResult,
    Observed,
    pool_status,
)
from lorapool.controller.writes import (
    PER_OBJECT_EVENTS,
    AdapterEvent,
    TokenBucket,
    WriteFailure,
    aggregate,
    classify,
    fold_repeats,
    write_failed_condition,
)
from lorapool.render.manifests import RenderOptions
from lorapool.sources.config import MAX_ENTRIES, MIN_ENTRIES, ConfigCache, immutable

pytestmark = pytest.mark.timeout(120)

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"
ETCD_LIMIT = 1_572_864  # etcd's default --max-request-bytes (1.5 MiB)


# --- the bounded pool status (pure) ----------------------------------------------------------------


def observed(inline: int, objects: int, bad: set[str] = frozenset()) -> Observed:  # type: ignore[assignment]
    def result(name: str, origin: str) -> AdapterResult:
        if name in bad:
            return AdapterResult(name, origin, 8, AdapterPhase.FAILED, f"trained on 'other/model', not {BASE}")
        return AdapterResult(name, origin, 8, AdapterPhase.LOADING)

    adapters = [result(f"inline-{i:04d}", "Inline") for i in range(inline)]
    adapters += [result(f"obj-{i:05d}", "LoRAAdapter") for i in range(objects)]
    return Observed(
        generation=1, plan=None, plan_errors=(), adapters=adapters, desired_replicas=2, engine=None,
        engine_generation_current=True, router_ready=True, unschedulable=None, endpoint="", selector="s",
    )  # fmt: skip


def test_todays_sizes_list_every_adapter_and_say_nothing_of_truncation() -> None:
    status = pool_status(observed(10, MAX_LISTED_OBJECTS))
    assert [a.name for a in status.adapters] == [f"inline-{i:04d}" for i in range(10)] + [
        f"obj-{i:05d}" for i in range(MAX_LISTED_OBJECTS)
    ]
    patch = status.to_patch()
    assert patch["adaptersTruncated"] is None and patch["worstAdapters"] is None
    assert patch["adapterPhases"] == {"Loading": 10 + MAX_LISTED_OBJECTS}
    # A status stored before these fields existed is not rewritten for their absence.
    stored = {k: v for k, v in patch.items() if v is not None}
    assert all(stored.get(k) == v for k, v in patch.items() if k in ("adaptersTruncated", "worstAdapters"))


def test_a_large_catalogue_is_truncated_keeping_inline_ones_and_the_worst_objects() -> None:
    bad = {f"obj-{i:05d}" for i in range(0, 10_000, 200)}  # 50 bad ones spread over 10,000
    status = pool_status(observed(1000, 10_000, bad))
    names = [a.name for a in status.adapters]
    assert len(names) == 1000 + MAX_LISTED_OBJECTS and names == sorted(names)  # original order kept
    assert all(f"inline-{i:04d}" in names for i in range(1000)) and bad <= set(names)
    wire = status.to_patch()
    assert wire["adaptersTruncated"] is True and wire["adapterCount"] == 11_000
    assert wire["adapterPhases"] == {"Loading": 11_000 - 50, "Failed": 50}
    worst = wire["worstAdapters"]
    assert len(worst) == MAX_WORST and {w["name"] for w in worst} <= bad
    assert all(w["phase"] == "Failed" and "trained on" in w["message"] for w in worst)
    degraded = next(c for c in wire["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "and 40 more problem(s)" in degraded["message"]
    size = len(json.dumps({"status": wire}))
    assert size < ETCD_LIMIT // 2, f"pool status is {size} bytes"


def test_long_adapter_messages_are_clipped_in_the_pool_but_not_the_count() -> None:
    long = AdapterResult("x", "LoRAAdapter", 8, AdapterPhase.FAILED, "e" * 5000)
    status = pool_status(replace(observed(0, 0), adapters=[long]))
    message = status.adapters[0].message or ""
    assert len(message) == 512 and message.endswith("\u2026")


# --- writes: rate limit, failures, Events (pure) -------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(qps=10, burst=3, now=0.0)
    assert [bucket.reserve(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(0.0) == pytest.approx(0.1)
    assert bucket.reserve(0.0) == pytest.approx(0.2)  # reservations queue up
    assert bucket.reserve(10.0) == 0.0  # refilled, capped at the burst
    assert [bucket.reserve(10.0) for _ in range(2)] == [0.0, 0.0] and bucket.reserve(10.0) > 0
    with pytest.raises(ValueError, match="qps > 0"):
        TokenBucket(qps=0, burst=1)


@pytest.mark.parametrize(
    ("code", "detail", "reason"),
    [
        (413, "Request entity too large: limit is 3145728", "TooLarge"),
        (422, 'ConfigMap "p-adapters" is invalid: []: Too long: must have at most 1048576 bytes', "TooLarge"),
        (500, "etcdserver: request is too large", "TooLarge"),
        (409, "the object has been modified", "Conflict"),
        (403, 'loraadapters.lorapool.io "a" is forbidden', "Forbidden"),
        (422, "spec.replicas: Invalid value", "Invalid"),
        (503, "unavailable", "WriteError"),
    ],
)
def test_a_refused_write_is_classified(code: int, detail: str, reason: str) -> None:
    assert classify(code, detail) == reason


def test_write_failed_condition_names_what_failed_and_what_to_do() -> None:
    assert write_failed_condition([], 1) is None
    failures = [WriteFailure("apply", "ConfigMap", "p-adapters", 422, "Too long: must have at most 1048576 bytes")]
    failures += [WriteFailure("status", "LoRAAdapter", f"a{i}", 403, "forbidden") for i in range(5)]
    cond = write_failed_condition(failures, 3)
    assert cond is not None and cond.type == "WriteFailed" and cond.status == "True" and cond.reason == "TooLarge"
    assert "apply ConfigMap p-adapters" in cond.message and "and 3 more failed write(s)" in cond.message
    assert "1 MiB" in cond.message and cond.observed_generation == 3


def test_many_adapter_transitions_become_one_pool_event_per_reason() -> None:
    few = [AdapterEvent(f"a{i}", "Loaded", "loaded") for i in range(PER_OBJECT_EVENTS)]
    assert aggregate(few) == (few, [])
    many = [AdapterEvent(f"a{i:04d}", "Loaded", "loaded on 2") for i in range(1000)]
    many += [AdapterEvent(f"b{i}", "Invalid", f"bad {i}", "Warning") for i in range(3)]
    single, pooled = aggregate(many)
    assert single == [] and [(e.reason, e.type, e.count) for e in pooled] == [
        ("Invalid", "Warning", 3),
        ("Loaded", "Normal", 1000),
    ]
    assert pooled[1].message.startswith("1000 adapter(s) Loaded: a0000, a0001, a0002, a0003, a0004 and 995 more")
    assert "(first, b0: bad 0)" in pooled[0].message
    folded = fold_repeats(
        [("AdapterFailed", f"adapter a{i}: x", "Warning") for i in range(50)] + [("PoolReady", "", "Normal")]
    )
    assert [(e.reason, e.count) for e in folded] == [("AdapterFailed", 50), ("PoolReady", 1)]


# --- the index (pure) ------------------------------------------------------------------------------


def adapter(name: str, pool: str = "p", source: str = "hf://acme/x", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": name, "namespace": "ml", "generation": 1, "uid": f"uid-{name}", **meta},
        "spec": {"poolRef": {"name": pool}, "source": source},
    }


def test_the_index_keeps_adapters_by_pool_and_the_watch_wins_over_the_initial_list() -> None:
    index = AdapterIndex()
    index.observe("ADDED", adapter("new", managedFields=[{"manager": "kubectl"}]))
    index.observe("DELETED", adapter("gone"))
    index.observe("MODIFIED", adapter("moved", pool="q"))
    assert not index.primed("ml")
    index.prime("ml", [adapter("old"), adapter("gone"), adapter("moved", pool="p"), adapter("new", generation=0)])
    assert index.primed("ml") and index.lists == 1
    assert [a["metadata"]["name"] for a in index.of_pool("ml", "p")] == ["new", "old"]
    assert [a["metadata"]["name"] for a in index.of_pool("ml", "q")] == ["moved"]
    assert "managedFields" not in index.of_pool("ml", "p")[0]["metadata"]
    index.observe("MODIFIED", adapter("old", pool="q"))  # it left p
    assert [a["metadata"]["name"] for a in index.of_pool("ml", "q")] == ["moved", "old"]
    index.record_status("ml", "old", {"phase": "Ready", "rank": None})
    assert index.of_pool("ml", "q")[1]["status"] == {"phase": "Ready"}  # null removes, as on the server
    index.observe("DELETED", adapter("old", pool="q"))
    assert len(index) == 2 and index.of_pool("ml", "p")[0]["metadata"]["name"] == "new"
    index.observe(None, {"metadata": {}})  # no name: ignored, not a crash
    assert len(index) == 2


# --- the config cache (pure) -----------------------------------------------------------------------


def test_the_config_cache_is_sized_by_the_catalogue_within_a_bound() -> None:
    now = [0.0]
    cache = ConfigCache(ttl_s=60, clock=lambda: now[0])
    cache.fit(3000)
    for i in range(3000):
        cache.put((f"hf://acme/a{i}", None), {"r": 8})
    assert len(cache) == 3000 and cache.get(("hf://acme/a0", None)) == {"r": 8}  # nothing evicted: no re-read
    cache.fit(10)
    assert len(cache) == MIN_ENTRIES and cache.max_entries == MIN_ENTRIES
    cache.fit(10**9)
    assert cache.max_entries == MAX_ENTRIES


def test_a_commit_revision_is_never_re_read_other_entries_after_the_ttl() -> None:
    now = [0.0]
    cache = ConfigCache(ttl_s=60, clock=lambda: now[0])
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert immutable(commit) and not immutable("main") and not immutable(None)
    cache.put(("hf://acme/a", commit), {"r": 8})
    cache.put(("hf://acme/a", "main"), {"r": 8})
    now[0] = 3600.0
    assert cache.get(("hf://acme/a", commit)) == {"r": 8}
    assert cache.get(("hf://acme/a", "main")) is None


# --- the reconcile over an in-memory API that counts its calls -------------------------------------


class Api:
    """The reconcile's Kube calls over dicts, counting each (verb, kind); LoRAAdapter writes are echoed
    to ``index`` the way the watch would, at once (``echo``) or never (a watch that lags the write)."""

    def __init__(self, index: AdapterIndex, *objects: dict[str, Any], echo: bool = True) -> None:
        self.objects = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
        self.index, self.calls, self.echo = index, Counter[tuple[str, str]](), echo
        self.events: list[tuple[str, str, str]] = []
        self.version = 100

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls["get", kind] += 1
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, kind: str, namespace: str, selector: str | None = None, resource_version: str | None = None
    ) -> list[dict[str, Any]]:
        self.calls["list", kind] += 1
        want = dict(kv.split("=", 1) for kv in selector.split(",")) if selector else {}
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and ns == namespace and want.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def apply(self, obj: dict[str, Any]) -> bool:
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if self.objects.get(key, {}).get("spec") == obj.get("spec") and key[0] != "ConfigMap":
            return False
        self.calls["apply", obj["kind"]] += 1
        self.objects[key] = copy.deepcopy(obj)
        return True

    def annotate(self, kind: str, namespace: str, name: str, annotations: dict[str, str | None]) -> bool:
        self.calls["annotate", kind] += 1
        return (kind, namespace, name) in self.objects

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.calls["status", kind] += 1
        obj = self.objects[(kind, namespace, name)]
        obj["status"] = mergepatch.apply(obj.get("status") or {}, status)  # as the API server merges
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        if kind == "LoRAAdapter" and self.echo:
            self.index.observe("MODIFIED", obj)

    def event(self, involved: dict[str, Any], *, reason: str, message: str, type_: str = "Normal") -> None:
        self.calls["create", "Event"] += 1
        self.events.append((involved["kind"], reason, message))

    def serves(self, group_version: str, plural: str) -> bool:
        return False

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        self.objects.pop((kind, namespace, name), None)


def pool_body() -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": "p", "namespace": "ml", "generation": 1, "uid": "pool-uid"},
        "spec": {"baseModel": {"name": BASE, "source": f"hf://{BASE}"}, "gpu": {"product": "A100-80GB"}, "replicas": 2},
    }


async def config_of(source: str, revision: str | None, **_: Any) -> dict[str, Any]:
    """Sources under hf://bad/ were trained on another base model: refused with a reason."""
    base = "mistralai/Mistral-7B-v0.1" if source.startswith("hf://bad/") else BASE
    return {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj"],
        "base_model_name_or_path": base,
    }


def test_two_thousand_adapters_fifty_bad_one_list_and_writes_only_on_change() -> None:
    names = [f"a{i:04d}" for i in range(2000)]
    bad = set(names[::40])  # 50
    adapters = [adapter(n, source=f"hf://{'bad' if n in bad else 'acme'}/{n}") for n in names]
    index = AdapterIndex()
    api: Any = Api(index, pool_body(), *adapters)
    reconciler = PoolReconciler(api, config_of, Settings(render=RenderOptions(), write_qps=1e6, write_burst=10**6),
                                index=index, cache=ConfigCache())  # fmt: skip

    asyncio.run(reconciler.reconcile("ml", "p"))
    assert api.calls["list", "LoRAAdapter"] == 1 and api.calls["status", "LoRAAdapter"] == 2000
    for n in names:
        status = api.objects["LoRAAdapter", "ml", n]["status"]
        if n in bad:
            assert status["phase"] == "Failed" and "trained on 'mistralai/Mistral-7B-v0.1'" in status["message"]
        else:
            assert status["phase"] == "Loading"
    pool = api.objects["LoRAPool", "ml", "p"]["status"]
    assert pool["adaptersTruncated"] is True and len(pool["adapters"]) == MAX_LISTED_OBJECTS
    assert pool["adapterPhases"] == {"Loading": 1950, "Failed": 50}
    assert {w["name"] for w in pool["worstAdapters"]} <= bad and len(pool["worstAdapters"]) == MAX_WORST
    assert bad <= {a["name"] for a in pool["adapters"]}
    # 50 Invalid transitions and 50 AdapterFailed: one Event each on the pool, none per adapter.
    assert [(kind, reason) for kind, reason, _ in api.events if reason in ("Invalid", "AdapterFailed")] == [
        ("LoRAPool", "Invalid"),
        ("LoRAPool", "AdapterFailed"),
    ]
    assert all(kind == "LoRAPool" for kind, _, _ in api.events) and len(api.events) == 4
    assert api.events[0][2].startswith("50 adapter(s) Invalid: a0000, a0040")

    # A second pass over an unchanged catalogue: no list, no status write.
    before = api.calls.copy()
    asyncio.run(reconciler.reconcile("ml", "p"))
    assert api.calls["list", "LoRAAdapter"] == 1
    assert api.calls["status", "LoRAAdapter"] == before["status", "LoRAAdapter"]

    # An operator restart (a new index, listed once) rewrites nothing either.
    restarted = PoolReconciler(api, config_of, Settings(render=RenderOptions()), index=AdapterIndex())
    asyncio.run(restarted.reconcile("ml", "p"))
    assert api.calls["list", "LoRAAdapter"] == 2 and api.calls["status", "LoRAAdapter"] == 2000
    assert api.calls["status", "LoRAPool"] == before["status", "LoRAPool"]

    # One adapter fixed (the watch tells the index): its status is written, and only the few others
    # whose status it changed (placement moves an adapter to make room).
    fixed = adapter(names[0], source=f"hf://acme/{names[0]}", generation=2)
    api.objects["LoRAAdapter", "ml", names[0]] = fixed
    index.observe("MODIFIED", fixed)
    statuses = {n: copy.deepcopy(api.objects["LoRAAdapter", "ml", n].get("status")) for n in names}
    asyncio.run(reconciler.reconcile("ml", "p"))
    changed = {n for n in names if api.objects["LoRAAdapter", "ml", n].get("status") != statuses[n]}
    assert names[0] in changed and len(changed) < 10
    assert api.calls["status", "LoRAAdapter"] == before["status", "LoRAAdapter"] + len(changed)
    assert api.objects["LoRAAdapter", "ml", names[0]]["status"]["phase"] == "Loading"
    assert api.objects["LoRAPool", "ml", "p"]["status"]["adapterPhases"] == {"Loading": 1951, "Failed": 49}


def test_a_transition_is_an_event_on_its_adapter_before_the_watch_echoes_the_write() -> None:
    # The index keeps what the operator wrote (record_status) on the very object the reconcile read:
    # the Event must come from the status before the write, not from that object after it.
    index = AdapterIndex()
    api: Any = Api(index, pool_body(), adapter("good"), adapter("wrong", source="hf://bad/wrong"), echo=False)
    reconciler = PoolReconciler(api, config_of, Settings(render=RenderOptions()), index=index)
    asyncio.run(reconciler.reconcile("ml", "p"))
    assert [(kind, reason) for kind, reason, _ in api.events if kind == "LoRAAdapter"] == [("LoRAAdapter", "Invalid")]
    assert index.of_pool("ml", "p")[1]["status"]["phase"] == "Failed"  # the index has the write
    asyncio.run(reconciler.reconcile("ml", "p"))  # no transition since: no second Event
    assert [reason for kind, reason, _ in api.events if kind == "LoRAAdapter"] == ["Invalid"]


def test_a_deleted_pool_writes_no_orphan_status_on_adapters_being_deleted() -> None:
    index = AdapterIndex()
    doomed = adapter("doomed", deletionTimestamp="2026-12-07T00:00:00Z")
    api: Any = Api(index, adapter("left"), doomed)  # no pool p
    reconciler = PoolReconciler(api, config_of, Settings(render=RenderOptions()), index=index)
    result = asyncio.run(reconciler.reconcile("ml", "p"))
    assert result.forget and api.calls["status", "LoRAAdapter"] == 1
    assert "status" not in api.objects["LoRAAdapter", "ml", "doomed"]
    assert "no LoRAPool p" in api.objects["LoRAAdapter", "ml", "left"]["status"]["message"]


def test_pool_status_model_keeps_its_bounds_in_the_crd() -> None:
    schema = LoRAPoolStatus.model_json_schema(by_alias=True)
    assert "adaptersTruncated" in schema["properties"] and "worstAdapters" in schema["properties"]


class Queue:
    """What the watch handlers ask of the work queue."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []

    def add(self, namespace: str, name: str) -> None:
        self.added.append((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        pass


def test_the_adapter_watch_feeds_the_index_even_when_it_triggers_nothing() -> None:
    from lorapool.controller.app import build_registry

    index, queue = AdapterIndex(), Queue()
    registry = build_registry(cast(Any, queue), index)
    handlers: list[Any] = [h.fn for h in registry._watching.get_all_handlers()]
    handler = next(fn for fn in handlers if fn.__name__ == "adapter_event")

    def deliver(type_: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        call = handler(type=type_, namespace=meta["namespace"], name=meta["name"], spec=body["spec"], meta=meta,
                       event={"type": type_, "object": body})  # fmt: skip
        asyncio.run(call)

    body = adapter("a")
    deliver("ADDED", body)
    assert queue.added == [("ml", "p")] and index.of_pool("ml", "p")[0]["metadata"]["name"] == "a"
    deliver("MODIFIED", {**body, "status": {"phase": "Ready"}})  # the echo of a status write
    assert queue.added == [("ml", "p")] and index.of_pool("ml", "p")[0]["status"] == {"phase": "Ready"}
    deliver("DELETED", body)
    assert queue.added == [("ml", "p")] * 2 and index.of_pool("ml", "p") == []


def test_shards_a_shrunk_set_no_longer_renders_are_deleted_once_and_only_the_pools_own() -> None:
    """A set that shrank below the shard budget is inline in its index again: the old shards go
    (after the index stops naming them), a user's ConfigMap of the same labels stays, and an
    unchanged pool looks for leftovers no more."""
    from lorapool.render import names

    def shard(i: int, owner: str | None) -> dict[str, Any]:
        meta = {**names.metadata("ml", names.adapter_shard("p", i), "p", "adapters"), "uid": f"shard-{i}"}
        if owner is not None:
            meta["ownerReferences"] = [{"uid": owner, "controller": True, "kind": "LoRAPool", "name": "p"}]
        return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta, "data": {}}

    index = AdapterIndex()
    api: Any = Api(index, pool_body(), adapter("a0001"), shard(0, "pool-uid"), shard(1, "pool-uid"), shard(2, None))
    reconciler = PoolReconciler(api, config_of, Settings(render=RenderOptions()), index=index, cache=ConfigCache())
    asyncio.run(reconciler.reconcile("ml", "p"))
    left = {n for k, _, n in api.objects if k == "ConfigMap" and n.startswith("p-adapters-")}
    assert left == {names.adapter_shard("p", 2)}  # not the pool's: kept
    index_cm = api.objects["ConfigMap", "ml", names.adapters_configmap("p")]
    assert json.loads(index_cm["data"]["index.json"])["shards"] == []  # inline again
    lists = api.calls["list", "ConfigMap"]
    asyncio.run(reconciler.reconcile("ml", "p"))
    assert api.calls["list", "ConfigMap"] == lists == 1  # nothing changed: not looked for again


def test_source_reads_are_bounded_across_pools_and_time_out_only_while_reading() -> None:
    """Two pools reconciled at once share one bound on reads (2 here), and a read's timeout starts once
    it runs: 20 reads of 50 ms in 2 lanes take 0.5 s, past the 0.2 s timeout, yet none times out (after
    an operator restart, 100 pools' reads queued behind each other and 5,072 adapters were marked
    unreadable)."""
    running, peak = 0, 0

    async def slow(source: str, revision: str | None, **_: Any) -> dict[str, Any]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return await config_of(source, revision)

    second = copy.deepcopy(pool_body())
    second["metadata"].update(name="q", uid="pool-q")
    adapters = [adapter(f"{pool}{i}", pool=pool, source=f"hf://acme/{pool}{i}") for pool in "pq" for i in range(10)]
    index = AdapterIndex()
    api: Any = Api(index, pool_body(), second, *adapters)
    settings = Settings(render=RenderOptions(), metadata_concurrency=2, metadata_timeout_s=0.2)
    reconciler = PoolReconciler(api, slow, settings, index=index)

    async def both() -> None:
        await asyncio.gather(reconciler.reconcile("ml", "p"), reconciler.reconcile("ml", "q"))

    asyncio.run(both())
    assert peak == 2
    phases = {
        a["metadata"]["name"]: api.objects["LoRAAdapter", "ml", a["metadata"]["name"]]["status"] for a in adapters
    }
    assert all(s["phase"] == "Loading" and s["rank"] == 8 for s in phases.values()), phases


def test_api_calls_run_on_the_threads_given_and_source_reads_do_not_wait_for_them() -> None:
    """controller.app gives the reconciles' API calls their own threads; the default executor, where
    a local source is read, stays free of them."""
    from concurrent.futures import ThreadPoolExecutor

    index = AdapterIndex()
    api: Any = Api(index, pool_body(), adapter("a0", source="hf://acme/a0"))
    threads: set[str] = set()
    patch_status = api.patch_status

    def recording(*args: Any, **kwargs: Any) -> None:
        threads.add(threading.current_thread().name)
        patch_status(*args, **kwargs)

    api.patch_status = recording
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kube-api") as pool:
        reconciler = PoolReconciler(api, config_of, Settings(render=RenderOptions()), index=index, api_threads=pool)
        asyncio.run(reconciler.reconcile("ml", "p"))
    assert threads and all(name.startswith("kube-api") for name in threads), threads
