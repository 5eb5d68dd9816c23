"""Fixtures for tests against the local control plane (see lorapool_dev.cluster.pytest_plugin)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lorapool_dev.cluster import LocalCluster

# local_cluster comes from lorapool_dev.cluster.pytest_plugin, loaded by tests/conftest.py,
# so every test package shares one control plane per session.


@pytest.fixture(scope="session")
def api_client(local_cluster: LocalCluster) -> Iterator[Any]:
    """The official client, as the operator uses it, authenticated as the admin."""
    from kubernetes import config

    client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(local_cluster.kubeconfig)
    )
    yield client
    client.close()


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (the namespace controller empties it)."""
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
