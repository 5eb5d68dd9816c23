"""pytest fixtures for tests that need the local control plane.

Registered once for the whole suite by `tests/conftest.py` (`pytest_plugins =
["lorapool.cluster.pytest_plugin"]`), so every test package shares one cluster per session:
starting one takes ~12 s, far more than any test that uses it. Do not import `local_cluster`
into another conftest: that defines a second fixture, hence a second cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lorapool.cache import cache_root
from lorapool.cluster import build
from lorapool.cluster.runtime import COMPONENTS, LocalCluster

# Budget for starting the session cluster (it takes ~12 s on an idle 2-core machine). The first
# test using `local_cluster` pays it inside its own pytest-timeout, so add it to that timeout.
CLUSTER_START_S = 90.0


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A running LocalCluster with the default fake nodes, stopped at the end of the session.

    Skips when the binaries are not built, except in CI (CI=true), where that is a failure:
    `.ci/run` builds them first with scripts/build-control-plane.
    """
    missing = build.missing(cache_root(), COMPONENTS)
    if missing:
        message = f"control plane not built ({', '.join(c.key for c in missing)}); run scripts/build-control-plane"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    state_dir = tmp_path_factory.mktemp("lorapool-cluster")
    with LocalCluster(state_dir, timeout_s=CLUSTER_START_S) as cluster:
        yield cluster
