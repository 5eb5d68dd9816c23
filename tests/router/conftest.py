"""Fixtures that start real simulator and router processes on loopback."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from lorapool.testing.peft import write_peft_adapter
from lorapool.testing.processes import RunningProcess, free_port, start_process

ADAPTERS = ("sql", "chat", "code", "math")
BASE = "meta-llama/Meta-Llama-3-8B-Instruct"

StartSim = Callable[..., str]
StartRouter = Callable[..., str]


@pytest.fixture(scope="session")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small real PEFT adapters, one directory each."""
    root = tmp_path_factory.mktemp("adapters")
    return {name: write_peft_adapter(root / name, rank=8, seed=i) for i, name in enumerate(ADAPTERS)}


@pytest.fixture
def processes() -> Iterator[dict[str, RunningProcess]]:
    """Every process a test started, by URL; all stopped at the end."""
    running: dict[str, RunningProcess] = {}
    yield running
    for proc in running.values():
        proc.close()


@pytest.fixture
def start_sim(processes: dict[str, RunningProcess], adapter_dirs: dict[str, Path]) -> StartSim:
    """Start a ``lorapool sim`` serving the test adapters; returns its URL."""

    def start(*, max_loras: int = 2, time_scale: float = 1.0, extra: Sequence[str] = ()) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        modules = [f"{name}={path}" for name, path in adapter_dirs.items()]
        cmd = [
            sys.executable, "-m", "lorapool.cli", "sim", "--port", str(port), "--enable-lora",
            "--max-loras", str(max_loras), "--max-cpu-loras", str(len(modules)),
            "--time-scale", str(time_scale), "--lora-modules", *modules, *extra,
        ]  # fmt: skip
        processes[url] = start_process(cmd, f"{url}/health", timeout=60)
        return url

    return start


@pytest.fixture
def start_router(processes: dict[str, RunningProcess]) -> StartRouter:
    """Start ``lorapool router`` in front of ``backends``; returns its URL."""

    def start(backends: Sequence[str], *, policy: str = "affinity", extra: Sequence[str] = ()) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "lorapool.cli", "router", "--port", str(port)]
        for backend in backends:
            cmd += ["--backend", backend]
        cmd += ["--policy", policy, "--poll-interval", "0.2", "--backend-header", *extra]
        processes[url] = start_process(cmd, f"{url}/livez", timeout=60)
        return url

    return start


def scrape(url: str) -> str:
    """The text of ``url``/metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        return resp.read().decode()


def metric(page: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
