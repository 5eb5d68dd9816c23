"""Helpers to run the vLLM simulator and the sidecar as real processes on loopback, and to
read them. Imported by name from the sidecar tests (tests are not a package)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from lorapool_dev.testing.components import start_sidecar as start_sidecar_process
from lorapool_dev.testing.components import start_sim as start_sim_process
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.scrape import samples
from lorapool_dev.testing.wait import WaitTimeout, wait_until

BASE_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def get_text(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


# what a check may raise while the sidecar or the engine is still getting there
NOT_YET = (OSError, KeyError, ValueError)


def start_sim(port: int, *, max_lora_rank: int = 64) -> RunningProcess:
    sim = start_sim_process(
        port=port, served_model_name=BASE_MODEL, max_loras=4, max_cpu_loras=8, max_lora_rank=max_lora_rank,
        time_scale=0, timeout_s=30,
    )  # fmt: skip
    return sim.proc


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
            return dict(wait_until(f"{name} {phase} {fields}", check, timeout, retry_on=NOT_YET))
        except WaitTimeout as exc:
            raise AssertionError(
                f"{exc}\nstatus: {json.dumps(self.status(), indent=1)}\n{self.proc.output()[-3000:]}"
            ) from None


def start_sidecar(config: Path, engine_port: int, adapter_dir: Path, *extra: str) -> Sidecar:
    fast = [
        "--config-poll-seconds", "0.2", "--health-poll-seconds", "0.2", "--resync-seconds", "1",
        "--backoff-base-seconds", "0.3", "--backoff-cap-seconds", "1.5", "--http-timeout-seconds", "3",
        "--seed", "1",
    ]  # fmt: skip
    sidecar = start_sidecar_process(
        config=config, engine_url=f"http://127.0.0.1:{engine_port}", adapter_dir=adapter_dir, extra=[*fast, *extra]
    )
    return Sidecar(sidecar.proc, sidecar.port, adapter_dir)


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
    return {
        ",".join(f'{key}="{value}"' for key, value in labels.items()): value
        for labels, value in samples(text).get(name, [])
    }
