"""The sidecar's API reader of the adapter set (``lorapool.sources.setwatch``) against a small real HTTP
server on 127.0.0.1 that answers as the API server does for ConfigMaps: GET by name and a watch by
``fieldSelector=metadata.name``. The real kube-apiserver and the Role: tests/sidecar/test_setwatch_cluster.py.

A half-written update (the index names a shard whose content does not match yet) is never acted on;
the set is taken once the shard lands; the watch delivers a change without waiting for a re-read."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from lorapool.api.adapterset import (
    CONFIGMAP_KEY,
    INDEX_KEY,
    AdapterSet,
    AdapterSetIndex,
    DesiredAdapter,
    ShardRef,
    content_hash,
)
from lorapool.podstatus import ApiServer
from lorapool.sources.setwatch import SetRef, SetWatcher
from lorapool_dev.testing.components import LORAPOOL
from lorapool_dev.testing.processes import free_port

pytestmark = pytest.mark.timeout(60)

NS, INDEX = "ml", "p-adapters"
REF = SetRef(NS, INDEX)


def a_set(*names: str) -> AdapterSet:
    return AdapterSet(
        pool="p",
        base_model="m",
        max_lora_rank=16,
        adapters=tuple(DesiredAdapter(name=n, source=f"hf://org/{n}") for n in names),
    )


def sharded(parts: list[AdapterSet]) -> tuple[dict[str, str], dict[str, str]]:
    """(index data, shard name -> adapters.json) for a set cut into ``parts``."""
    texts = {f"p-adapters-{i}": part.to_json() for i, part in enumerate(parts)}
    whole = a_set(*(a.name for part in parts for a in part.adapters)).to_json()
    index = AdapterSetIndex(
        pool="p",
        generation=content_hash(whole),
        shards=tuple(ShardRef(name=n, sha256=content_hash(t), adapters=1) for n, t in texts.items()),
    )
    return {INDEX_KEY: index.to_json()}, texts


@dataclass
class FakeApi:
    """ConfigMaps by name, each with a resourceVersion; watchers woken on every write."""

    objects: dict[str, dict[str, str]] = field(default_factory=dict)
    forbidden: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    version: int = 1
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    versions: dict[str, int] = field(default_factory=dict)
    watching: asyncio.Event = field(default_factory=asyncio.Event)  # a watch is open
    closing: bool = False  # the server stops: open watches end, as the API server's do

    async def close(self) -> None:
        async with self.changed:
            self.closing = True
            self.changed.notify_all()

    async def put(self, name: str, data: dict[str, str]) -> None:
        async with self.changed:
            self.version += 1
            self.objects[name], self.versions[name] = data, self.version
            self.changed.notify_all()

    def body(self, name: str) -> dict[str, Any]:
        meta = {"name": name, "namespace": NS, "resourceVersion": str(self.versions[name])}
        return {"kind": "ConfigMap", "metadata": meta, "data": self.objects[name]}

    async def get(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.requests.append(f"get {name}")
        if name in self.forbidden:
            return web.json_response({"kind": "Status", "reason": "Forbidden", "code": 403}, status=403)
        if name not in self.objects:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(self.body(name))

    async def watch(self, request: web.Request) -> web.StreamResponse:
        selector = request.query.get("fieldSelector", "")
        name = selector.removeprefix("metadata.name=")
        self.requests.append(f"watch {name}")
        if request.query.get("watch") != "true" or not selector.startswith("metadata.name="):
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        since = int(request.query.get("resourceVersion") or 0)
        resp = web.StreamResponse()
        await resp.prepare(request)
        self.watching.set()
        async with self.changed:
            await self.changed.wait_for(lambda: self.closing or self.versions.get(name, 0) > since)
        if self.closing:
            return resp
        event = {"type": "MODIFIED", "object": self.body(name)}
        await resp.write(json.dumps(event).encode() + b"\n")
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ml/configmaps/{name}", self.get)
        app.router.add_get("/api/v1/namespaces/ml/configmaps", self.watch)
        return app


@asynccontextmanager
async def serving(api: FakeApi) -> AsyncIterator[ApiServer]:
    runner = web.AppRunner(api.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield ApiServer(f"http://127.0.0.1:{port}", ssl.create_default_context(), lambda: "token")
    finally:
        await api.close()
        await runner.cleanup()


def names_in(snapshot: bytes | None) -> list[str]:
    return sorted(a.name for a in AdapterSet.from_json(snapshot or b"").adapters)


def test_a_half_written_update_is_never_acted_on_and_is_taken_once_the_shard_lands() -> None:
    async def scenario() -> None:
        api = FakeApi()
        index, shards = sharded([a_set("a"), a_set("b")])
        for name, text in shards.items():
            await api.put(name, {CONFIGMAP_KEY: text})
        await api.put(INDEX, index)
        seen: list[bytes | None] = []
        async with serving(api) as server, aiohttp.ClientSession() as http:
            watcher = SetWatcher(server, REF, lambda: seen.append(watcher.snapshot))
            assert await watcher.read_once(http) is not None
            assert names_in(watcher.snapshot) == ["a", "b"] and watcher.error is None
            # The next generation's index lands while shard 1 still holds the old text.
            index2, shards2 = sharded([a_set("a"), a_set("b", "c")])
            await api.put(INDEX, index2)
            assert await watcher.read_once(http) is None
            assert names_in(watcher.snapshot) == ["a", "b"]  # the last consistent set, untouched
            assert watcher.error is not None and "p-adapters-1 does not match generation" in watcher.error
            await api.put("p-adapters-1", {CONFIGMAP_KEY: shards2["p-adapters-1"]})
            assert await watcher.read_once(http) is not None
            assert names_in(watcher.snapshot) == ["a", "b", "c"] and watcher.error is None
        assert [names_in(s) for s in seen] == [["a", "b"], ["a", "b", "c"]]  # never a half set

    asyncio.run(scenario())


def test_the_watch_delivers_a_change_without_waiting_for_the_periodic_read() -> None:
    async def scenario() -> None:
        api = FakeApi()
        await api.put(INDEX, {CONFIGMAP_KEY: a_set("a").to_json()})  # written before the index existed
        stop = asyncio.Event()
        async with serving(api) as server:
            changed = asyncio.Event()
            watcher = SetWatcher(server, REF, changed.set, resync_s=300)  # only the watch can be fast
            task = asyncio.create_task(watcher.run(stop))
            await asyncio.wait_for(changed.wait(), 5)  # the first read
            await asyncio.wait_for(api.watching.wait(), 5)
            assert names_in(watcher.snapshot) == ["a"]
            changed.clear()
            text = a_set("a", "b").to_json()
            index = AdapterSetIndex(pool="p", generation=content_hash(text))
            await api.put(INDEX, {INDEX_KEY: index.to_json(), CONFIGMAP_KEY: text})
            await asyncio.wait_for(changed.wait(), 2)  # well before the 300 s re-read
            assert names_in(watcher.snapshot) == ["a", "b"]
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # Only the index was read and watched, by name: what the Role's resourceNames allow.
        assert {r.split()[1] for r in api.requests} == {INDEX}

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        ("missing", "ConfigMap ml/p-adapters not found; the operator writes it"),
        ("forbidden", "GET ConfigMap ml/p-adapters: HTTP 403"),
        ("bad-index", "index.json: generation: String should match pattern"),
        ("missing-shard", "shard p-adapters-1 of generation"),
    ],
)
def test_a_set_that_cannot_be_read_says_why_and_keeps_nothing(setup: str, error: str) -> None:
    async def scenario() -> None:
        api = FakeApi()
        if setup == "forbidden":
            api.forbidden.add(INDEX)
            await api.put(INDEX, {CONFIGMAP_KEY: a_set("a").to_json()})
        elif setup == "bad-index":
            await api.put(INDEX, {INDEX_KEY: json.dumps({"pool": "p", "generation": "nope"})})
        elif setup == "missing-shard":
            index, shards = sharded([a_set("a"), a_set("b")])
            await api.put("p-adapters-0", {CONFIGMAP_KEY: shards["p-adapters-0"]})
            await api.put(INDEX, index)
        async with serving(api) as server, aiohttp.ClientSession() as http:
            watcher = SetWatcher(server, REF, lambda: None)
            assert await watcher.read_once(http) is None
        assert watcher.snapshot is None and watcher.error is not None and error in watcher.error
        assert "token" not in watcher.error.lower()

    asyncio.run(scenario())


@pytest.mark.parametrize("text", ["p-adapters", "/p-adapters", "ml/", "ml/a/b"])
def test_a_bad_configmap_reference_is_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected NAMESPACE/NAME, e\.g\. default/llama3-8b-adapters"):
        SetRef.parse(text)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "give exactly one of --adapters-configmap (in a pod) and --config (a local file)"),
        (["--config", "a.json", "--adapters-configmap", "ml/p-adapters"], "give exactly one of"),
        (["--adapters-configmap", "p-adapters"], "--adapters-configmap 'p-adapters': expected NAMESPACE/NAME"),
    ],
)
def test_the_sidecar_command_takes_exactly_one_source_of_the_set(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    argv = [*LORAPOOL, "sidecar", "--engine", "http://127.0.0.1:9", "--adapter-dir", str(tmp_path), *flags]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0 and f"lorapool sidecar: {message}" in result.stderr
