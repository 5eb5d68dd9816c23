"""Fixtures for source tests: real adapters, crafted archives, loopback servers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorapool_dev.testing.peft import write_peft_adapter

# Test helpers live beside this file; tests are not a package (importlib mode adds no path).
sys.path.insert(0, str(Path(__file__).parent))
from loopback_http import LoopbackServer


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    return write_peft_adapter(tmp_path / "adapter", rank=8)


@pytest.fixture
def http_server() -> Iterator[LoopbackServer]:
    server = LoopbackServer().start()
    yield server
    server.stop()
