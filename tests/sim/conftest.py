"""Fixtures that start ``lorapool sim`` as a real process and talk to it over loopback."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from lorapool_dev.testing import http
from lorapool_dev.testing.components import start_sim as start_sim_process
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess


@dataclass
class Sim:
    url: str
    proc: RunningProcess

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="sim", max_retries=0, timeout=30)

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, str]:
        """Raw HTTP: status and body text (vLLM's exact bytes, no client in between)."""
        answer = http.request(f"{self.url}{path}", method, body, content_type=content_type)
        return answer.status, answer.text

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        status, text = self.request("POST", path, body)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def metrics(self) -> str:
        return self.request("GET", "/metrics")[1]


StartSim = Callable[..., Sim]


@pytest.fixture(scope="session")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Write a real PEFT adapter directory: ``adapters("name", rank=8, extra_config=...)``."""
    root = tmp_path_factory.mktemp("sim-adapters")

    def make(name: str, **kwargs: Any) -> Path:
        return write_peft_adapter(root / name, **kwargs)

    return make


@pytest.fixture(scope="module")
def start_sim() -> Iterator[StartSim]:
    """Start simulators for a test module; runtime LoRA updating is on unless ``env`` says otherwise."""
    started: list[Sim] = []

    def start(*args: str, env: Mapping[str, str] | None = None) -> Sim:
        # raw flags (tests check the simulator's own parsing); runtime LoRA updating on by default
        component = start_sim_process(enable_lora=False, extra=args, env=env)
        sim = Sim(component.url, component.proc)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.proc.close()
