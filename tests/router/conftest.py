"""Fixtures that start real simulator and router processes on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from lorapool.api.common import RouterPolicy
from lorapool_dev.testing.components import start_router as start_router_process
from lorapool_dev.testing.components import start_sim as start_sim_process
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess

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
        sim = start_sim_process(
            max_loras=max_loras, max_cpu_loras=len(adapter_dirs), time_scale=time_scale,
            lora_modules=adapter_dirs, extra=extra,
        )  # fmt: skip
        processes[sim.url] = sim.proc
        return sim.url

    return start


@pytest.fixture
def start_router(processes: dict[str, RunningProcess]) -> StartRouter:
    """Start ``lorapool router`` in front of ``backends``; returns its URL."""

    def start(
        backends: Sequence[str],
        *,
        policy: str = RouterPolicy.AFFINITY,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        router = start_router_process(
            backends, policy=policy, extra=["--poll-interval", "0.2", "--backend-header", *extra], env=env
        )
        processes[router.url] = router.proc
        return router.url

    return start
