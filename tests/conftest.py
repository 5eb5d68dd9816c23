"""Shared fixtures: the README example and helpers to build pools in tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

# One local control plane per test session, shared by every package that needs it; and a test
# owns what it starts (threads, processes, ports: lorapool_dev.testing.leaks).
pytest_plugins = ["lorapool_dev.cluster.pytest_plugin", "lorapool_dev.testing.leaks", "lorapool_dev.testing.tiers"]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "lorapool.yaml"


@pytest.fixture
def example_doc() -> dict[str, Any]:
    """The issue's example pool, exactly as written, as a fresh dict per test."""
    return copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
