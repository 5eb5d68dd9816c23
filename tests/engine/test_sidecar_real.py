"""The sidecar against a real vLLM (CPU): hot-load, in-place swap, removal, refusals, engine crash.

One vLLM process serves the whole module (``engine``, module-scoped; the crash test restarts it
on the same port). Each test starts its own ``lorapool sidecar`` process, drives it only through
its adapters.json, and leaves the engine with no adapter loaded. Adapters are real PEFT
directories for the tiny Llama (``write_tiny_adapter``), served as ``file://`` sources.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from lorapool_dev.engine.fixtures import engine_or_skip
from lorapool_dev.engine.install import EngineInstall
from lorapool_dev.engine.server import ServeConfig, crash_engine, start_engine, stop_engine
from lorapool_dev.engine.tinymodel import AdapterKind, ensure_tiny_model, write_tiny_adapter
from lorapool_dev.testing import http
from lorapool_dev.testing.components import Component, start_sidecar
from lorapool_dev.testing.processes import ProcessError, RunningProcess, free_port
from lorapool_dev.testing.registry import run_registry
from lorapool_dev.testing.scrape import samples
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.engine

BASE = "tiny-llama"
MAX_LORA_RANK = 16
PROMPT = "The quick brown fox"
NOT_YET = (OSError, KeyError, ValueError)
FAST = [
    "--config-poll-seconds", "0.2", "--health-poll-seconds", "0.2", "--resync-seconds", "1",
    "--backoff-base-seconds", "0.3", "--backoff-cap-seconds", "1.5", "--http-timeout-seconds", "30",
    "--seed", "1",
]  # fmt: skip
LOAD_S = 60.0  # a load on the CPU engine takes ~0.1-1 s; a loaded machine is slower


class Engine:
    """The module's vLLM server; ``crash`` kills its whole process tree, ``start`` brings it back."""

    def __init__(self, install: EngineInstall, cfg: ServeConfig) -> None:
        self.install, self.cfg = install, cfg
        self.proc: RunningProcess | None = None

    def start(self) -> None:
        try:
            self.proc = start_engine("vllm", self.cfg, install=self.install)
        except ProcessError as exc:
            pytest.fail(f"vllm did not start: {exc}", pytrace=False)

    def died(self) -> str | None:
        """When the engine exited on its own: its exit code and last output, and it is started again,
        so one engine death fails the test it happened in with the reason, not every test after it."""
        if self.proc is None or self.proc.popen.poll() is None:
            return None
        code, output = self.proc.popen.returncode, self.proc.output()[-4000:]
        self.proc.close()
        self.proc = None
        self.start()
        return f"vllm exited with {code} during the test; its last output:\n{output}"

    def crash(self) -> None:
        assert self.proc is not None
        crash_engine(self.proc)
        self.proc.close()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_engine(self.proc)
            self.proc.close()
            self.proc = None

    def adapters(self) -> dict[str, str]:
        """Adapter name -> the path the engine loaded it from (its /v1/models cards)."""
        cards = http.request(f"{self.cfg.url}/v1/models", "GET").json()["data"]
        return {c["id"]: c["root"] for c in cards if c.get("parent")}

    def complete(self, model: str, max_tokens: int = 8) -> http.Response:
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
        return http.request(f"{self.cfg.url}/v1/completions", "POST", body, timeout_s=60)

    def text(self, model: str) -> str:
        resp = self.complete(model)
        assert resp.status == 200, resp.text
        return str(resp.json()["choices"][0]["text"])


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    install = engine_or_skip()
    cfg = ServeConfig(
        model=str(ensure_tiny_model(engine=install)), port=free_port(), served_model_name=BASE,
        max_loras=2, max_lora_rank=MAX_LORA_RANK, max_cpu_loras=4, cpu_threads_bind="0",
    )  # fmt: skip
    eng = Engine(install, cfg)
    eng.start()
    try:
        yield eng
    finally:
        eng.stop()


class Config:
    """adapters.json, replaced atomically (the sidecar polls it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, adapters: list[dict[str, Any]], *, max_lora_rank: int = MAX_LORA_RANK) -> None:
        doc = {
            "apiVersion": "lorapool.io/v1alpha1", "kind": "AdapterSet", "pool": "real",
            "baseModel": BASE, "maxLoraRank": max_lora_rank, "adapters": adapters,
        }  # fmt: skip
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)


class Sidecar:
    def __init__(self, component: Component) -> None:
        self.component = component

    def status(self) -> dict[str, Any]:
        return dict(http.request(f"{self.component.url}/status", "GET").json())

    def adapters(self) -> dict[str, dict[str, Any]]:
        return {a["name"]: a for a in self.status()["adapters"]}

    def metric(self, name: str) -> dict[str, float]:
        page = http.request(f"{self.component.url}/metrics", "GET").text
        return {",".join(f"{k}={v}" for k, v in labels.items()): value for labels, value in samples(page).get(name, [])}

    def wait_phase(self, name: str, phase: str, timeout_s: float = LOAD_S, **fields: Any) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            a = self.adapters().get(name)
            return a if a and a["phase"] == phase and all(a.get(k) == v for k, v in fields.items()) else None

        found = wait_until(
            f"{name} {phase} {fields}",
            check,
            timeout_s,
            retry_on=NOT_YET,
            describe=lambda: f"{self.adapters().get(name)}\n{self.component.proc.output()[-2000:]}",
        )
        assert found is not None  # wait_until returns only a truthy result
        return found


@pytest.fixture
def sidecar_for(engine: Engine, tmp_path: Path) -> Iterator[Any]:
    """Start a sidecar on the module's engine; on exit, unload everything it loaded, then stop it."""
    started: list[tuple[Sidecar, Config]] = []

    def start(*extra: str) -> tuple[Sidecar, Config]:
        config = Config(tmp_path / "adapters.json")
        config.write([])
        component = start_sidecar(
            config=config.path, engine_url=engine.cfg.url, adapter_dir=tmp_path / "store", extra=[*FAST, *extra]
        )
        started.append((Sidecar(component), config))
        return started[-1]

    yield start
    if died := engine.died():
        for sidecar, _ in started:
            sidecar.component.close()
        pytest.fail(died, pytrace=False)
    for sidecar, config in started:
        try:
            if engine.proc is not None:
                config.write([])
                wait_until("the engine to hold no adapter", lambda: not engine.adapters(), LOAD_S)
        finally:
            sidecar.component.close()


def _adapter(tmp: Path, name: str, *, seed: int, rank: int = 8, kind: AdapterKind = AdapterKind.GOOD) -> str:
    return (write_tiny_adapter(tmp / "src" / name, rank=rank, seed=seed, kind=kind)).as_uri()


def test_hot_load_swap_in_place_and_remove(engine: Engine, sidecar_for: Any, tmp_path: Path) -> None:
    sidecar, config = sidecar_for()
    base_text = engine.text(BASE)
    config.write(
        [
            {"name": "sql", "source": _adapter(tmp_path, "sql-v1", seed=11), "revision": "v1"},
            {"name": "chat", "source": _adapter(tmp_path, "chat", seed=12)},
        ]
    )
    sidecar.wait_phase("sql", "Loaded", revision="v1", rank=8)
    sidecar.wait_phase("chat", "Loaded")
    assert set(engine.adapters()) == {"sql", "chat"}
    v1_text, chat_text = engine.text("sql"), engine.text("chat")
    assert len({base_text, v1_text, chat_text}) == 3, (base_text, v1_text, chat_text)

    # A new revision is swapped in place while requests for it keep coming: none fails,
    # the name never leaves the engine, and the served output changes.
    old_root = engine.adapters()["sql"]
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            resp = engine.complete("sql", max_tokens=2)
            answers.append((resp.status, resp.text[:300]))

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        wait_until("a few answers before the swap", lambda: len(answers) >= 3, 30)
        config.write(
            [
                {"name": "sql", "source": _adapter(tmp_path, "sql-v2", seed=13), "revision": "v2"},
                {"name": "chat", "source": _adapter(tmp_path, "chat", seed=12)},
            ]
        )
        sidecar.wait_phase("sql", "Loaded", revision="v2")
        seen = len(answers)
        wait_until("a few answers after the swap", lambda: len(answers) >= seen + 3, 30)
    finally:
        stop.set()
        asker.join(timeout=120)
    assert not asker.is_alive()
    assert [a for a in answers if a[0] != 200] == []
    new_root = engine.adapters()["sql"]
    assert new_root != old_root  # a new path: vLLM keeps stale prefix-cache entries on a same-path reload
    v2_text = engine.text("sql")
    assert v2_text != v1_text
    assert sidecar.metric("lorapool_sidecar_loads_total").get("reason=revision") == 1.0

    # Removed from the set: unloaded; a request for it gets a clear 404 naming it.
    config.write([{"name": "sql", "source": _adapter(tmp_path, "sql-v2", seed=13), "revision": "v2"}])
    wait_until("chat unloaded", lambda: set(engine.adapters()) == {"sql"}, LOAD_S, retry_on=NOT_YET)
    wait_until("chat forgotten", lambda: "chat" not in sidecar.adapters(), 10, retry_on=NOT_YET)
    gone = engine.complete("chat")
    assert gone.status == 404 and "chat" in gone.json()["error"]["message"], gone.text
    assert engine.text("sql") == v2_text


def test_refused_adapters_fail_permanently_and_the_good_one_is_served(
    engine: Engine, sidecar_for: Any, tmp_path: Path
) -> None:
    """Rank too high reaches the engine (the pool says 64, the engine was started with 16): its
    500 is read as permanent. DoRA and a wrong base model are refused by the sidecar's own checks;
    a corrupt file by the sidecar or the engine. None is retried soon (the cap here is 600 s)."""
    sidecar, config = sidecar_for("--backoff-cap-seconds", "600")
    config.write(
        [
            {"name": "good", "source": _adapter(tmp_path, "good", seed=21)},
            {"name": "big", "source": _adapter(tmp_path, "big", seed=22, rank=32)},
            {"name": "dora", "source": _adapter(tmp_path, "dora", seed=23, kind=AdapterKind.DORA)},
            {"name": "corrupt", "source": _adapter(tmp_path, "corrupt", seed=24, kind=AdapterKind.CORRUPT)},
            {"name": "other", "source": _adapter(tmp_path, "other", seed=25, kind=AdapterKind.WRONG_BASE)},
        ],
        max_lora_rank=64,
    )
    sidecar.wait_phase("good", "Loaded")
    expected = {
        "big": "is greater than max_lora_rank 16",
        "dora": "DoRA",
        "corrupt": "",
        "other": "other-tiny-llama",
    }
    failed = {name: sidecar.wait_phase(name, "Failed") for name in expected}
    now = time.time()
    for name, words in expected.items():
        a = failed[name]
        assert words in a["error"] and name in a["error"], a
        assert a["attempts"] == 1, a
        retry_in_s = datetime.fromisoformat(a["nextRetryAt"].replace("Z", "+00:00")).timestamp() - now
        assert retry_in_s > 250, f"{name} is retried in {retry_in_s:.0f} s: a permanent failure waits near the cap"
    failures = sidecar.metric("lorapool_sidecar_failures_total")
    assert failures.get("reason=engine") == 1.0, failures  # only the rank refusal reached the engine's 500
    assert set(engine.adapters()) == {"good"}
    assert engine.text("good") != engine.text(BASE)


def test_an_adapter_pushed_by_the_cli_to_a_real_registry_is_served_by_digest(
    engine: Engine, sidecar_for: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lorapool adapter push`` (verified against the tiny Llama's own config.json) to the CNCF registry
    with htpasswd auth; the sidecar pulls it by digest with the pool's credentials (as rendered for
    spec.credentials.oci), real vLLM serves it, and the sidecar reports the digest it loaded."""
    with run_registry(tmp_path / "registry", auth="htpasswd") as registry:
        assert registry.username is not None and registry.password is not None
        adapter = write_tiny_adapter(tmp_path / "sql", rank=8, seed=21)
        ref = f"oci://{registry.host}/team/sql-coder:v1"
        config_json = Path(engine.cfg.model) / "config.json"
        digest = registry.push(adapter, ref, "--base-config", str(config_json))
        monkeypatch.setenv("LORAPOOL_OCI_AUTH", json.dumps(registry.docker_config()))
        monkeypatch.setenv("LORAPOOL_OCI_PLAIN_HTTP", registry.host)
        sidecar, config = sidecar_for()
        config.write([{"name": "sql", "source": f"oci://{registry.host}/team/sql-coder@{digest}"}])
        state = sidecar.wait_phase("sql", "Loaded")
        assert state["resolvedRevision"] == digest
        assert engine.text("sql") != engine.text(BASE)
        assert registry.password not in sidecar.component.proc.output()
        config.write([])
        wait_until("the engine to hold no adapter", lambda: not engine.adapters(), LOAD_S)


def test_everything_is_reloaded_after_the_engine_tree_is_killed_and_restarted(
    engine: Engine, sidecar_for: Any, tmp_path: Path
) -> None:
    sidecar, config = sidecar_for()
    config.write(
        [
            {"name": "one", "source": _adapter(tmp_path, "one", seed=31)},
            {"name": "two", "source": _adapter(tmp_path, "two", seed=32)},
            {"name": "three", "source": _adapter(tmp_path, "three", seed=33)},
        ]
    )
    for name in ("one", "two", "three"):
        sidecar.wait_phase(name, "Loaded")
    before = {name: engine.text(name) for name in ("one", "two", "three")}
    restarts = sidecar.status()["engine"]["restarts"]

    engine.crash()
    wait_until("the sidecar to see the engine down", lambda: sidecar.status()["engine"]["healthy"] is False, 30)
    engine.start()
    wait_until(
        "every adapter back in the restarted engine",
        lambda: set(engine.adapters()) == {"one", "two", "three"},
        LOAD_S,
        retry_on=NOT_YET,
        describe=lambda: sidecar.status(),
    )
    # The engine lists an adapter before the sidecar counts its load (it counts when it sets Loaded,
    # after the engine answered): each reload is counted once its phase is Loaded again.
    for name in ("one", "two", "three"):
        sidecar.wait_phase(name, "Loaded")
    assert {name: engine.text(name) for name in before} == before  # the same adapters, the same answers
    status = sidecar.status()
    assert status["engine"]["healthy"] and status["engine"]["restarts"] > restarts, status
    assert sidecar.metric("lorapool_sidecar_loads_total").get("reason=lost") == 3.0
