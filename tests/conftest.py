"""Shared fixtures: the README example and helpers to build pools in tests."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

# One local control plane per test session, shared by every package that needs it; and a test
# owns what it starts (threads, processes, ports: lorapool_dev.testing.leaks).
pytest_plugins = ["lorapool_dev.cluster.pytest_plugin", "lorapool_dev.testing.leaks", "lorapool_dev.testing.tiers"]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "lorapool.yaml"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """A real S3-compatible server (moto in server mode) on 127.0.0.1, one per test module."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def example_doc() -> dict[str, Any]:
    """The issue's example pool, exactly as written, as a fresh dict per test."""
    return copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
