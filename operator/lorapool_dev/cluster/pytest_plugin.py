"""pytest fixtures for tests that need the local control plane.

Registered once for the whole suite by `tests/conftest.py` (`pytest_plugins =
["lorapool_dev.cluster.pytest_plugin"]`), so every test package shares one cluster per session:
starting one takes ~12 s, far more than any test that uses it. Do not import `local_cluster`
into another conftest: that defines a second fixture, hence a second cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.node import RealNode, missing_prerequisites
from lorapool_dev.cluster.runtime import COMPONENTS, LocalCluster
from lorapool_dev.image.build import build_images

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


# Budget for starting the session's real node: its own control plane (~10 s), containerd, the
# kubelet, kube-proxy (~4 s) and importing both image archives (~15 s) on an idle machine.
REAL_NODE_START_S = 240.0


def require_real_node() -> None:
    """Skip with the plain reason when a real node cannot run here; under CI, fail instead."""
    problems = missing_prerequisites()
    if problems:
        message = f"a real kubelet node cannot run here: {'; '.join(problems)}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A control plane with one real kubelet node (cluster/node.py) in a network namespace of
    the run's own, with both project images imported and the KWOK nodes tainted: every pod
    runs for real. Marker `node`; skips without root/containerd, fails so under CI."""
    require_real_node()
    archives = [Path(image.archive) for image in build_images()]
    with RealNode(tmp_path_factory.mktemp("real-node"), images=archives, timeout_s=REAL_NODE_START_S) as node:
        yield node
