"""Helpers to run the vLLM simulator and the sidecar as real processes on loopback, and to
read them. Imported by name from the sidecar tests (tests are not a package)."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lorapool.testing.processes import RunningProcess, free_port, start_process

BASE_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def get_text(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def eventually(check: Callable[[], Any], *, timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns a truthy value; fail with the last value or error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, KeyError, ValueError) as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def start_sim(port: int, *, max_lora_rank: int = 64) -> RunningProcess:
    cmd = [
        sys.executable,
        "-m",
        "lorapool.cli",
        "sim",
        "--port",
        str(port),
        "--served-model-name",
        BASE_MODEL,
        "--enable-lora",
        "--max-loras",
        "4",
        "--max-cpu-loras",
        "8",
        "--max-lora-rank",
        str(max_lora_rank),
        "--time-scale",
        "0",
    ]
    return start_process(
        cmd, f"http://127.0.0.1:{port}/health", timeout=30, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
    )


class Sidecar:
    """A running ``lorapool sidecar`` and handy views of its /status."""

    def __init__(self, proc: RunningProcess, port: int, adapter_dir: Path) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.adapter_dir = adapter_dir

    def status(self) -> dict[str, Any]:
        return dict(get_json(f"{self.url}/status"))

    def adapters(self) -> dict[str, dict[str, Any]]:
        return {a["name"]: a for a in self.status()["adapters"]}

    def metrics(self) -> str:
        return get_text(f"{self.url}/metrics")

    def wait_phase(self, name: str, phase: str, timeout: float = 15.0, **fields: Any) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            a = self.adapters().get(name)
            if a and a["phase"] == phase and all(a.get(k) == v for k, v in fields.items()):
                return a
            return None

        try:
            return dict(eventually(check, timeout=timeout, what=f"{name} {phase} {fields}"))
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\nstatus: {json.dumps(self.status(), indent=1)}\n{self.proc.output()[-3000:]}"
            ) from None


def start_sidecar(config: Path, engine_port: int, adapter_dir: Path, *extra: str) -> Sidecar:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "lorapool.cli",
        "sidecar",
        "--config",
        str(config),
        "--engine",
        f"http://127.0.0.1:{engine_port}",
        "--adapter-dir",
        str(adapter_dir),
        "--status-port",
        str(port),
        "--config-poll-seconds",
        "0.2",
        "--health-poll-seconds",
        "0.2",
        "--resync-seconds",
        "1",
        "--backoff-base-seconds",
        "0.3",
        "--backoff-cap-seconds",
        "1.5",
        "--http-timeout-seconds",
        "3",
        "--seed",
        "1",
        *extra,
    ]
    return Sidecar(start_process(cmd, f"http://127.0.0.1:{port}/healthz", timeout=30), port, adapter_dir)


def adapter_set(adapters: list[dict[str, Any]], *, max_lora_rank: int = 16) -> str:
    return json.dumps(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "AdapterSet",
            "pool": "demo",
            "baseModel": BASE_MODEL,
            "maxLoraRank": max_lora_rank,
            "adapters": adapters,
        },
        indent=1,
    )


class ConfigMapDir:
    """A directory laid out like a ConfigMap volume: adapters.json -> ..data/adapters.json,
    ``..data`` swapped atomically on every update, as the kubelet does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / "adapters.json"
        self._n = 0

    def write(self, text: str) -> None:
        self._n += 1
        version = self.root / f"..2026_{self._n:04d}"
        version.mkdir()
        (version / "adapters.json").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        tmp.replace(self.root / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to("..data/adapters.json")


def engine_adapters(port: int) -> dict[str, str]:
    cards = get_json(f"http://127.0.0.1:{port}/v1/models")["data"]
    return {c["id"]: c["root"] for c in cards if c.get("parent")}


def metric_samples(text: str, name: str) -> dict[str, float]:
    """Samples of one Prometheus metric: label string (``reason="rank"`` or "") -> value."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            out[head[len(name) :].strip("{}")] = float(value)
    return out
