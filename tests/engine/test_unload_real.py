"""Unload on a real vLLM (CPU build 0.32): what a replica still holds, and what a re-load costs.

One vLLM serves the module with ``--max-loras 1 --max-cpu-loras 2`` and ``lora_cache.INSPECT_ENV``,
so the test reads what the engine holds from the engine itself: its CPU cache by ``lora_int_id``
(dev-mode ``list_loras``) and, from its DEBUG log, each read from disk, GPU-slot activation and
removal. Measured (docs/vllm.md, "Unload, measured"):

- ``/v1/unload_lora_adapter`` forgets the name (``/v1/models``, 404 for a request) and nothing
  else: the copy stays in the CPU cache and in its GPU slot until the LRU needs the room.
- a re-load of the same name gets a NEW ``lora_int_id`` and reads the disk again; the old copy
  is dead weight in the CPU cache until it is the least recently used there.
- an adapter still loaded but pushed out of its GPU slot comes back from the CPU cache (no disk
  read); one pushed out of the CPU cache is read from disk again at its next request, same id.
- through a real ``lorapool sidecar``: a placement move drains (kept, served, then unloaded), a move
  back during the drain costs nothing, a deletion goes at once, and an adapter re-added after its
  drain loads from the files the sidecar kept (no download) and is read from disk under a new id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorapool_dev.engine.fixtures import engine_or_skip
from lorapool_dev.engine.lora_cache import INSPECT_ENV, LoraEvent, LoraEventKind, fetch_cached_lora_ids, lora_events
from lorapool_dev.engine.server import ServeConfig, start_engine, stop_engine
from lorapool_dev.engine.tinymodel import ensure_tiny_model, write_tiny_adapter
from lorapool_dev.testing import http
from lorapool_dev.testing.components import Component, start_sidecar
from lorapool_dev.testing.processes import ProcessError, RunningProcess, free_port
from lorapool_dev.testing.scrape import samples
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

BASE = "tiny-llama"
NOT_YET = (OSError, KeyError, ValueError)
STEP_S = 60.0  # one load or one request on the CPU engine: ~0.1 s; a loaded machine is slower
FAST = [
    "--config-poll-seconds", "0.2", "--health-poll-seconds", "0.2", "--resync-seconds", "1",
    "--backoff-base-seconds", "0.3", "--backoff-cap-seconds", "1.5", "--http-timeout-seconds", "30",
    "--seed", "1",
]  # fmt: skip


def read(i: int) -> LoraEvent:
    return LoraEvent(LoraEventKind.READ, i)


def slot0(i: int) -> LoraEvent:
    return LoraEvent(LoraEventKind.ACTIVATED, i, 0)


def removed(i: int) -> LoraEvent:
    return LoraEvent(LoraEventKind.REMOVED, i)


class Engine:
    """The module's vLLM, read through its API, its CPU cache and its log."""

    def __init__(self, proc: RunningProcess, cfg: ServeConfig) -> None:
        self.proc, self.url = proc, cfg.url

    def names(self) -> set[str]:
        """The adapter names the serving layer lists (/v1/models)."""
        cards = http.request(f"{self.url}/v1/models", "GET").json()["data"]
        return {c["id"] for c in cards if c.get("parent")}

    def cached(self) -> set[int]:
        return fetch_cached_lora_ids(self.url)

    def post(self, path: str, body: dict[str, Any]) -> http.Response:
        return http.request(f"{self.url}{path}", "POST", body, timeout_s=STEP_S)

    def load(self, name: str, path: Path) -> None:
        resp = self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        assert resp.status == 200, resp.text

    def unload(self, name: str) -> None:
        resp = self.post("/v1/unload_lora_adapter", {"lora_name": name})
        assert resp.status == 200, resp.text

    def complete(self, model: str) -> http.Response:
        return self.post("/v1/completions", {"model": model, "prompt": "The quick", "max_tokens": 2, "temperature": 0})

    def mark(self) -> int:
        """Where the log's next complete line starts: events are read from here on."""
        return self.proc.output().rfind("\n") + 1

    def events_since(self, mark: int) -> list[LoraEvent]:
        text = self.proc.output()[mark:]
        return lora_events(text[: text.rfind("\n") + 1])

    def wait_events(self, mark: int, count: int, what: str) -> list[LoraEvent]:
        """The first ``count`` events since ``mark`` once they are all written (the worker writes
        them before the API answers; the wait covers the log file's write)."""

        def written() -> list[LoraEvent] | None:
            events = self.events_since(mark)
            return events[:count] if len(events) >= count else None

        return wait_until(
            what,
            written,
            STEP_S,
            describe=lambda: [str(e) for e in self.events_since(mark)],
        )

    def wait_read(self, mark: int, what: str) -> LoraEvent:
        """The first read from disk since ``mark``."""
        return wait_until(
            what,
            lambda: next((e for e in self.events_since(mark) if e.kind is LoraEventKind.READ), None),
            STEP_S,
            describe=lambda: [str(e) for e in self.events_since(mark)],
        )


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    install = engine_or_skip()
    cfg = ServeConfig(
        model=str(ensure_tiny_model(engine=install)), port=free_port(), served_model_name=BASE,
        max_loras=1, max_lora_rank=16, max_cpu_loras=2, cpu_threads_bind="0",
    )  # fmt: skip
    try:
        proc = start_engine("vllm", cfg, install=install, env=INSPECT_ENV)
    except ProcessError as exc:
        pytest.fail(f"vllm did not start: {exc}", pytrace=False)
    try:
        yield Engine(proc, cfg)
    finally:
        stop_engine(proc)
        proc.close()


def _step(engine: Engine, what: str, act: Any, count: int) -> list[LoraEvent]:
    """``act``, then the first ``count`` LoRA cache events it caused."""
    mark = engine.mark()
    act()
    return engine.wait_events(mark, count, what)


def _names(events: list[LoraEvent]) -> list[str]:
    return [str(e) for e in events]


def test_unload_forgets_the_name_only_and_a_reload_reads_the_disk_under_a_new_id(
    engine: Engine, tmp_path: Path
) -> None:
    paths = {n: write_tiny_adapter(tmp_path / n, seed=40 + i) for i, n in enumerate(["f1", "f2", "a", "b", "c"])}
    # A known start whatever ran before: two loads fill the 2-entry CPU cache with f1, f2 (f2 in the slot).
    fillers = []
    for filler in ("f1", "f2"):
        mark = engine.mark()
        engine.load(filler, paths[filler])
        fillers.append(engine.wait_read(mark, f"{filler} read").lora_id)
        engine.unload(filler)
    f1, f2 = fillers
    assert engine.cached() == {f1, f2}
    try:
        events = _step(engine, "a read and put in the slot", lambda: engine.load("a", paths["a"]), 4)
        a1 = events[1].lora_id
        assert events == [removed(f1), read(a1), removed(f2), slot0(a1)], _names(events)
        _ok(engine.complete("a"))

        # Unload: the name is gone, the copy is not.
        engine.unload("a")
        assert engine.names() == set()
        gone = engine.complete("a")
        assert gone.status == 404, gone.text
        assert gone.json()["error"] == {
            "message": f"The model `a` does not exist. Valid aliases: {BASE}.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
        assert engine.cached() == {f2, a1}, "the unloaded copy is still in the CPU cache"

        # Re-load from the same path: a new id, read from disk; it takes the slot the dead copy held.
        events = _step(engine, "a re-read", lambda: engine.load("a", paths["a"]), 4)
        a2 = events[1].lora_id
        assert a2 != a1 and events == [removed(f2), read(a2), removed(a1), slot0(a2)], _names(events)
        assert engine.cached() == {a1, a2}, "the dead copy and the new one, side by side"

        # LRU pressure: loading b evicts the dead copy (the oldest) from the CPU cache.
        events = _step(engine, "b read", lambda: engine.load("b", paths["b"]), 4)
        b1 = events[1].lora_id
        assert events == [removed(a1), read(b1), removed(a2), slot0(b1)], _names(events)
        assert engine.cached() == {a2, b1}

        # a lost its slot but not its CPU-cache entry: back in the slot without a disk read.
        events = _step(engine, "a back in the slot", lambda: _ok(engine.complete("a")), 2)
        assert events == [removed(b1), slot0(a2)], _names(events)

        # c pushes b (least recently used) out of the CPU cache; b, still loaded, is read from disk
        # again at its next request, under its own id.
        events = _step(engine, "c read", lambda: engine.load("c", paths["c"]), 4)
        c1 = events[1].lora_id
        assert events == [removed(b1), read(c1), removed(a2), slot0(c1)], _names(events)
        events = _step(engine, "b re-read at its request", lambda: _ok(engine.complete("b")), 4)
        assert events == [removed(a2), read(b1), removed(c1), slot0(b1)], _names(events)
        assert engine.cached() == {b1, c1}
    finally:
        for name in {"a", "b", "c"} & engine.names():
            engine.unload(name)


def _ok(resp: http.Response) -> None:
    assert resp.status == 200, resp.text


# ---- through the sidecar: placement moves, deletions, re-adds -----------------------------------


class Sidecar:
    """A real ``lorapool sidecar`` on the module's engine, slot 0, driven by its adapters.json."""

    def __init__(self, component: Component, config: Path) -> None:
        self.component, self.config = component, config

    def place(self, adapters: dict[str, tuple[Path, list[int]]]) -> list[str]:
        """Write the pool's adapters (name -> (directory, slots)); return how many configs the sidecar
        had applied before, for ``applied``."""
        before = self.configs_applied()
        entries = [{"name": n, "source": p.as_uri(), "replicas": slots} for n, (p, slots) in adapters.items()]
        doc = {"apiVersion": "lorapool.io/v1alpha1", "kind": "AdapterSet", "pool": "unload", "baseModel": BASE,
               "maxLoraRank": 16, "adapters": entries}  # fmt: skip
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.config)
        return before

    def configs_applied(self) -> list[str]:
        """The sidecar's "Loaded config" log lines so far (one per config it applied)."""
        return [line for line in self.component.proc.output().splitlines() if '"Loaded config"' in line]

    def applied(self, before: list[str], *, share: int, listed: int) -> None:
        """Wait for the sidecar to apply the config written after ``before``: ``share`` of the pool's
        ``listed`` adapters are this replica's (its log says so; /status has no finer clock than 1 s)."""

        def done() -> bool:
            new = self.configs_applied()[len(before) :]
            return bool(new) and f"adapters={share} listed={listed}" in new[-1]

        wait_until("the sidecar to apply the new config", done, STEP_S, describe=lambda: self.configs_applied())

    def status(self) -> dict[str, Any]:
        return dict(http.request(f"{self.component.url}/status", "GET").json())

    def phases(self) -> dict[str, str]:
        return {a["name"]: a["phase"] for a in self.status()["adapters"]}

    def counter(self, name: str) -> float:
        page = http.request(f"{self.component.url}/metrics", "GET").text
        return sum(value for _, value in samples(page).get(name, []))


@pytest.fixture
def sidecar_with(engine: Engine, tmp_path: Path) -> Iterator[Any]:
    """Start a sidecar with ``--drain-seconds`` as given; on exit, empty its set and stop it."""
    started: list[Sidecar] = []

    def start(drain_s: float) -> Sidecar:
        config, slot = tmp_path / "adapters.json", tmp_path / "slot"
        slot.write_text("0")
        config.write_text(json.dumps({"pool": "unload", "baseModel": BASE, "maxLoraRank": 16, "adapters": []}))
        extra = [*FAST, "--slot-file", str(slot), "--drain-seconds", str(drain_s)]
        component = start_sidecar(config=config, engine_url=engine.url, adapter_dir=tmp_path / "store", extra=extra)
        started.append(Sidecar(component, config))
        return started[-1]

    yield start
    for sidecar in started:
        try:
            sidecar.place({})
            wait_until("the engine to hold no adapter", lambda: not engine.names(), STEP_S, retry_on=NOT_YET)
        finally:
            sidecar.component.close()


def _loaded(engine: Engine, sidecar: Sidecar, name: str) -> None:
    wait_until(f"{name} Loaded and listed", lambda: sidecar.phases().get(name) == "Loaded" and name in engine.names(),
               STEP_S, retry_on=NOT_YET, describe=sidecar.status)  # fmt: skip


def _gone(engine: Engine, sidecar: Sidecar, name: str, timeout_s: float) -> None:
    wait_until(f"{name} gone from the report and the engine",
               lambda: name not in sidecar.phases() and name not in engine.names(),
               timeout_s, retry_on=NOT_YET, describe=sidecar.status)  # fmt: skip


def test_a_move_back_during_the_drain_costs_nothing_and_a_deletion_goes_at_once(
    engine: Engine, sidecar_with: Any, tmp_path: Path
) -> None:
    sidecar = sidecar_with(60.0)
    m = write_tiny_adapter(tmp_path / "src" / "m", seed=51)
    mark = engine.mark()
    sidecar.place({"m": (m, [0])})
    _loaded(engine, sidecar, "m")
    m_id = engine.wait_read(mark, "m read").lora_id
    cached = engine.cached()
    assert m_id in cached

    # Placement moves m to slot 1: drained, so still loaded, reported and served here.
    sidecar.applied(sidecar.place({"m": (m, [1])}), share=0, listed=1)
    assert sidecar.phases()["m"] == "Loaded" and "m" in engine.names()
    _ok(engine.complete("m"))

    # ... and back to slot 0 before the drain is over: nothing was unloaded, downloaded or read.
    mark = engine.mark()
    sidecar.applied(sidecar.place({"m": (m, [0])}), share=1, listed=1)
    _ok(engine.complete("m"))
    assert [e for e in engine.events_since(mark) if e.kind is LoraEventKind.READ] == []
    assert engine.cached() == cached
    assert sidecar.counter("lorapool_sidecar_unloads_total") == 0
    assert sidecar.counter("lorapool_sidecar_loads_total") == 1

    # Deleted from the pool: unloaded at once, well inside the 60 s drain a move would get.
    sidecar.place({})
    _gone(engine, sidecar, "m", timeout_s=30.0)
    assert sidecar.counter("lorapool_sidecar_unloads_total") == 1
    assert m_id in engine.cached(), "the engine keeps the unloaded copy"


def test_an_adapter_re_added_after_its_drain_loads_its_kept_files_and_is_read_again_under_a_new_id(
    engine: Engine, sidecar_with: Any, tmp_path: Path
) -> None:
    sidecar = sidecar_with(1.0)
    m = write_tiny_adapter(tmp_path / "src" / "m", seed=52)
    mark = engine.mark()
    sidecar.place({"m": (m, [0])})
    _loaded(engine, sidecar, "m")
    first = engine.wait_read(mark, "m read").lora_id
    downloaded = sidecar.counter("lorapool_sidecar_download_bytes_total")
    assert downloaded > 0

    # Moved away: drained for 1 s, then unloaded; the report and the engine agree it is gone.
    sidecar.place({"m": (m, [1])})
    _gone(engine, sidecar, "m", timeout_s=STEP_S)
    assert engine.complete("m").status == 404
    assert first in engine.cached(), "the engine keeps the unloaded copy"

    # Moved back: converges to Loaded from the files the sidecar kept at the unload (no download;
    # spec.sidecar.keepUnloaded), but the engine reads them under a new id.
    mark = engine.mark()
    sidecar.place({"m": (m, [0])})
    _loaded(engine, sidecar, "m")
    again = engine.wait_read(mark, "m re-read").lora_id
    assert again != first
    assert sidecar.counter("lorapool_sidecar_download_bytes_total") == downloaded
    assert sidecar.counter("lorapool_sidecar_kept_hits_total") == 1
    assert sidecar.counter("lorapool_sidecar_loads_total") == 2
    _ok(engine.complete("m"))
