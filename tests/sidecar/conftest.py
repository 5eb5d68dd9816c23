"""Fixtures for sidecar tests: a loopback file server and the vLLM simulator as a process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorapool_dev.testing.processes import RunningProcess, free_port

# Helpers live beside the tests; the loopback file server is shared with tests/sources.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "sources"))
from loopback_http import LoopbackServer
from sidecar_procs import start_sim


@pytest.fixture
def files() -> Iterator[LoopbackServer]:
    server = LoopbackServer().start()
    yield server
    server.stop()


@pytest.fixture
def engine_port() -> int:
    return free_port()


@pytest.fixture
def sim(engine_port: int) -> Iterator[RunningProcess]:
    with start_sim(engine_port) as proc:
        yield proc
