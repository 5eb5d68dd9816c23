"""The sidecar as a real process against the real simulator process, over loopback.

Each test starts ``lorapool sim`` and ``lorapool sidecar`` the way a pod does and drives
them only through files, HTTP and signals.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tarfile
import threading
import urllib.request
from pathlib import Path

import pytest
from loopback_http import LoopbackServer
from sidecar_procs import (
    BASE_MODEL,
    NOT_YET,
    ConfigMapDir,
    adapter_set,
    engine_adapters,
    metric_samples,
    start_sidecar,
    start_sim,
)
from source_helpers import make_tar, tar_of_dir

from lorapool_dev.testing.components import start_sim as start_sim_process
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.slow


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _publish(files: LoopbackServer, tmp: Path, name: str, **kw: object) -> tuple[str, str]:
    """Serve a fresh adapter as an archive; return (url, sha256 of the archive)."""
    src = write_peft_adapter(tmp / f"src-{name}", **kw)  # type: ignore[arg-type]
    archive = tar_of_dir(tmp / f"{name}.tgz", src, prefix=f"{name}/")
    return files.add_file(f"/{name}.tgz", archive), _sha(archive)


def test_add_hot_swap_remove_and_adopt(
    tmp_path: Path, files: LoopbackServer, sim: RunningProcess, engine_port: int
) -> None:
    url_a, sha_a = _publish(files, tmp_path, "sql", seed=1)
    dir_b = write_peft_adapter(tmp_path / "chat", seed=2)
    url_b = files.add_dir("/dirs/chat", dir_b)
    sha_b = _sha(dir_b / "adapter_model.safetensors")
    cfg = ConfigMapDir(tmp_path / "cfg")
    cfg.write(
        adapter_set(
            [
                {"name": "sql", "source": url_a, "revision": "v1", "sha256": sha_a},
                {"name": "chat", "source": url_b, "sha256": sha_b},
            ]
        )
    )
    adapters = tmp_path / "adapters"
    sidecar = start_sidecar(cfg.path, engine_port, adapters)
    try:
        sidecar.wait_phase("sql", "Loaded", rank=8, revision="v1")
        sidecar.wait_phase("chat", "Loaded")
        roots = engine_adapters(engine_port)
        assert set(roots) == {"sql", "chat"}
        assert all(Path(r).parent == adapters / ".store" for r in roots.values())
        assert (adapters / "sql").resolve() == Path(roots["sql"]).resolve()
        status = sidecar.status()
        assert status["engine"]["healthy"] and status["config"]["error"] is None and status["maxLoraRank"] == 16
        assert sidecar.adapters()["sql"]["loadedAt"]

        # A request for the adapter is served by the engine.
        req = urllib.request.Request(
            f"http://127.0.0.1:{engine_port}/v1/completions",
            data=json.dumps({"model": "sql", "prompt": "hi", "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read())["model"] == "sql"

        # New revision: downloaded, then hot-swapped in place; the name never leaves /v1/models.
        old_root = roots["sql"]
        url_a2, sha_a2 = _publish(files, tmp_path, "sql-v2", seed=3)
        missing: list[dict[str, str]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                try:
                    seen = engine_adapters(engine_port)
                except OSError as exc:  # reported by the assertion below, not as a stray thread error
                    missing.append({"error": repr(exc)})
                    continue
                if "sql" not in seen:
                    missing.append(seen)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            cfg.write(
                adapter_set(
                    [
                        {"name": "sql", "source": url_a2, "revision": "v2", "sha256": sha_a2},
                        {"name": "chat", "source": url_b, "sha256": sha_b},
                    ]
                )
            )
            wait_until(
                "hot swap", lambda: engine_adapters(engine_port).get("sql") not in (None, old_root), retry_on=NOT_YET
            )
        finally:
            stop.set()
            watcher.join(10)
        assert missing == []
        sidecar.wait_phase("sql", "Loaded", revision="v2")
        # The old revision's files are collected after the swap (the store's GC follows the Loaded phase).
        wait_until("the old revision's files collected", lambda: not Path(old_root).exists())

        # Remove an adapter: unloaded from the engine, its pointer deleted, its files kept for a
        # place-back (spec.sidecar.keepUnloaded; tests/sidecar/test_keep_unloaded.py).
        cfg.write(adapter_set([{"name": "sql", "source": url_a2, "revision": "v2", "sha256": sha_a2}]))
        wait_until("chat unloaded", lambda: set(engine_adapters(engine_port)) == {"sql"}, retry_on=NOT_YET)
        wait_until("chat forgotten", lambda: "chat" not in sidecar.adapters(), retry_on=NOT_YET)
        assert not (adapters / "chat").exists()
        assert len(list((adapters / ".store").iterdir())) == 2 and len(list((adapters / ".kept").iterdir())) == 1
        assert metric_samples(sidecar.metrics(), "lorapool_sidecar_unloads_total") == {"": 1.0}
        assert metric_samples(sidecar.metrics(), "lorapool_sidecar_loads_total") == {
            'reason="new"': 2.0,
            'reason="revision"': 1.0,
        }
    finally:
        sidecar.proc.close()

    # A restarted sidecar adopts what the engine already holds from its store: no reload.
    again = start_sidecar(cfg.path, engine_port, adapters)
    try:
        again.wait_phase("sql", "Loaded", revision="v2", rank=8)
        assert metric_samples(again.metrics(), "lorapool_sidecar_loads_total") == {}
        # logged by the adopting thread just after it sets the phase /status shows
        wait_until("the adoption logged", lambda: "Adopted adapter" in again.proc.output(), 10)
    finally:
        again.proc.close()


def test_bad_adapters_fail_with_fix_it_messages_and_never_block_the_good_one(
    tmp_path: Path, files: LoopbackServer, sim: RunningProcess, engine_port: int
) -> None:
    good, good_sha = _publish(files, tmp_path, "good")
    corrupt_src = tar_of_dir(tmp_path / "c.tgz", write_peft_adapter(tmp_path / "c"))
    files.routes["/corrupt.tgz"] = corrupt_src.read_bytes()[:300]
    high, _ = _publish(files, tmp_path, "high", rank=64)
    dora, _ = _publish(files, tmp_path, "dora", extra_config={"use_dora": True})
    mistral, _ = _publish(files, tmp_path, "mistral", base_model="mistralai/Mistral-7B-v0.1")
    src = write_peft_adapter(tmp_path / "evil-src")
    members = [(f.name, f.read_bytes()) for f in src.iterdir()]
    files.add_file("/dotdot.tgz", make_tar(tmp_path / "dotdot.tgz", [*members, ("../../pwned", b"x")]))
    link = tarfile.TarInfo("adapter_model.safetensors")  # a symlink pointing out of the archive
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    config_only = [(f.name, f.read_bytes()) for f in src.iterdir() if f.name == "adapter_config.json"]
    files.add_file("/symlink.tgz", make_tar(tmp_path / "symlink.tgz", [*config_only, link]))

    config = tmp_path / "adapters.json"
    config.write_text(
        adapter_set(
            [
                {"name": "good", "source": good, "sha256": good_sha},
                {"name": "corrupt", "source": f"{files.url}/corrupt.tgz"},
                {"name": "badsha", "source": good, "sha256": "0" * 64},
                {"name": "high", "source": high},
                {"name": "dora", "source": dora},
                {"name": "mistral", "source": mistral},
                {"name": "dotdot", "source": f"{files.url}/dotdot.tgz"},
                {"name": "symlink", "source": f"{files.url}/symlink.tgz"},
                {"name": "../escape", "source": good},
            ]
        )
    )
    sidecar = start_sidecar(config, engine_port, tmp_path / "adapters")
    try:
        sidecar.wait_phase("good", "Loaded")
        expected = {
            "corrupt": "the archive is corrupt or truncated",
            "badsha": "sha256 mismatch for the archive bytes",
            "high": "rank 64 exceeds the pool's max-lora-rank 16; set spec.lora.maxLoraRank: 64 or auto",
            "dora": "vLLM does not serve DoRA adapters; retrain without DoRA",
            "mistral": "trained on base model 'mistralai/Mistral-7B-v0.1' but the pool serves",
            "dotdot": "contains '..'; remove it",
            "symlink": "outside the archive; remove the link",
            "../escape": "name: String should match pattern",
        }
        for name, fix in expected.items():
            a = sidecar.wait_phase(name, "Failed")
            assert a["error"].startswith(f"adapter {name!r}: ") and fix in a["error"], a["error"]
        assert set(engine_adapters(engine_port)) == {"good"}
        assert sidecar.adapters()["high"]["rank"] == 64  # the rank read from the adapter is shown
        assert not list(tmp_path.rglob("pwned")) and not (tmp_path / "escape").exists()
        wait_until("retries with backoff", lambda: sidecar.adapters()["high"]["attempts"] >= 2, retry_on=NOT_YET)
        failures = metric_samples(sidecar.metrics(), "lorapool_sidecar_failures_total")
        for reason in ("checksum", "rank", "unservable", "base-model", "unsafe", "invalid"):
            assert failures.get(f'reason="{reason}"', 0) >= 1, (reason, failures)
    finally:
        sidecar.proc.close()


def test_source_down_backs_off_then_recovers(
    tmp_path: Path, files: LoopbackServer, sim: RunningProcess, engine_port: int
) -> None:
    url, _ = _publish(files, tmp_path, "flaky")
    files.down_status = 503
    config = tmp_path / "adapters.json"
    config.write_text(adapter_set([{"name": "flaky", "source": url}]))
    sidecar = start_sidecar(config, engine_port, tmp_path / "adapters")
    try:
        failing = wait_until(
            "retries visible in /status",
            lambda: (a := sidecar.adapters().get("flaky")) and a["attempts"] >= 2 and a["nextRetryAt"] and a,
            retry_on=NOT_YET,
        )
        assert failing["phase"] == "Failed" and "HTTP 503" in failing["error"] and "retrying" in failing["error"]
        files.down_status = None
        loaded = sidecar.wait_phase("flaky", "Loaded")
        assert loaded["attempts"] == 0 and loaded["nextRetryAt"] is None and loaded["error"] is None
        failures = metric_samples(sidecar.metrics(), "lorapool_sidecar_failures_total")
        assert failures['reason="download"'] >= 2
    finally:
        sidecar.proc.close()


def test_waits_for_the_engine_and_reloads_everything_after_an_engine_restart(
    tmp_path: Path, files: LoopbackServer, engine_port: int
) -> None:
    urls = [_publish(files, tmp_path, n, seed=i)[0] for i, n in enumerate(["one", "two"])]
    config = tmp_path / "adapters.json"
    config.write_text(adapter_set([{"name": n, "source": u} for n, u in zip(["one", "two"], urls, strict=True)]))
    sidecar = start_sidecar(config, engine_port, tmp_path / "adapters")
    try:
        wait_until("engine down at start", lambda: sidecar.status()["engine"]["healthy"] is False, retry_on=NOT_YET)
        assert {a["phase"] for a in sidecar.status()["adapters"]} <= {"Pending"}
        with start_sim(engine_port):
            sidecar.wait_phase("one", "Loaded")
            sidecar.wait_phase("two", "Loaded")
        wait_until("engine seen down", lambda: sidecar.status()["engine"]["healthy"] is False, retry_on=NOT_YET)
        with start_sim(engine_port):
            wait_until(
                "reloaded after restart", lambda: set(engine_adapters(engine_port)) == {"one", "two"}, retry_on=NOT_YET
            )
            assert sidecar.status()["engine"]["restarts"] == 1
            sidecar.wait_phase("one", "Loaded")
        # A restart fast enough to slip between health probes is caught by /v1/models losing adapters.
        sim = start_sim(engine_port)
        try:
            wait_until("loaded again", lambda: set(engine_adapters(engine_port)) == {"one", "two"}, retry_on=NOT_YET)
            sim.popen.send_signal(signal.SIGKILL)
            sim.popen.wait(10)
        finally:
            sim.close()
        with start_sim(engine_port):
            wait_until("reloaded again", lambda: set(engine_adapters(engine_port)) == {"one", "two"}, retry_on=NOT_YET)
            assert sidecar.status()["engine"]["restarts"] >= 2
            assert metric_samples(sidecar.metrics(), "lorapool_sidecar_engine_restarts_total")[""] >= 2
    finally:
        sidecar.proc.close()


def test_bad_config_keeps_the_last_good_set_and_sighup_rereads(
    tmp_path: Path, files: LoopbackServer, sim: RunningProcess, engine_port: int
) -> None:
    url, _ = _publish(files, tmp_path, "keep")
    cfg = ConfigMapDir(tmp_path / "cfg")
    cfg.write(adapter_set([{"name": "keep", "source": url}]))
    # Polling is off (an hour): only SIGHUP makes the sidecar look at the file again.
    sidecar = start_sidecar(cfg.path, engine_port, tmp_path / "adapters", "--config-poll-seconds", "3600")
    try:
        sidecar.wait_phase("keep", "Loaded")
        cfg.write("{ this is not json")
        os.kill(sidecar.proc.pid, signal.SIGHUP)
        error = wait_until("config error", lambda: sidecar.status()["config"]["error"], retry_on=NOT_YET)
        assert "not valid JSON" in error and "keeping the last good set of 1 adapters" in error
        assert set(engine_adapters(engine_port)) == {"keep"}
        sidecar.wait_phase("keep", "Loaded")

        cfg.write(adapter_set([], max_lora_rank=0))  # valid JSON, invalid document
        os.kill(sidecar.proc.pid, signal.SIGHUP)
        wait_until(
            "schema error", lambda: "maxLoraRank" in (sidecar.status()["config"]["error"] or ""), retry_on=NOT_YET
        )
        assert set(engine_adapters(engine_port)) == {"keep"}

        cfg.write(adapter_set([]))
        os.kill(sidecar.proc.pid, signal.SIGHUP)
        wait_until("unloaded by the fixed config", lambda: engine_adapters(engine_port) == {}, retry_on=NOT_YET)
        assert sidecar.status()["config"]["error"] is None
        assert "lorapool_sidecar_config_errors_total 2.0" in sidecar.metrics()
    finally:
        sidecar.proc.close()


def test_engine_without_the_runtime_lora_api_is_explained(tmp_path: Path, files: LoopbackServer) -> None:
    url, _ = _publish(files, tmp_path, "one")
    config = tmp_path / "adapters.json"
    config.write_text(adapter_set([{"name": "one", "source": url}]))
    no_runtime_api = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "false"}
    with start_sim_process(served_model_name=BASE_MODEL, env=no_runtime_api, timeout_s=30) as sim:
        port = sim.port
        sidecar = start_sidecar(config, port, tmp_path / "adapters")
        try:
            failed = sidecar.wait_phase("one", "Failed")
            assert "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true" in failed["error"]
        finally:
            sidecar.proc.close()
