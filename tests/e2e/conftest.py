"""The e2e target: any cluster (LORAPOOL_E2E_KUBECONFIG), else the suite's real kubelet node, else
the local control plane with KWOK nodes only.

On a real cluster (kind via e2e/kind.sh, the suite's real node `lorapool_dev.cluster.node`, or any
cluster with the images) the chart's operator pods run and the engine pods run the simulator
image. The suite's real node enforces NetworkPolicy (kube-network-policies, cluster/netpol.py)
from before the chart is installed; on another cluster its CNI must (kind's kindnet does). On the KWOK-only control plane (LORAPOOL_E2E_NODE=kwok, or where a real node cannot run
and CI is unset) KWOK fakes the pods, so the chart-installed operator is run here as a local
process with the chart's own arguments and the chart's ServiceAccount token: exactly the
chart's RBAC.

Environment:
  LORAPOOL_E2E_KUBECONFIG  a cluster to test; unset: the suite's real node (or KWOK, see above)
  LORAPOOL_E2E_NODE        `real` (default) or `kwok`: which local target when no kubeconfig is given
  LORAPOOL_E2E_IMAGE       lorapool image for the chart (default: the release image; locally lorapool:test)
  LORAPOOL_E2E_SIM_IMAGE   engine image, the Dockerfile's `sim` target (default lorapool-sim:e2e)
  LORAPOOL_E2E_KEEP=1      keep the release, namespaces and pool for inspection
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import lorapool
from lorapool.cache import cache_root
from lorapool_dev.cluster import LocalCluster, build
from lorapool_dev.cluster.node import RealNode, missing_prerequisites
from lorapool_dev.cluster.versions import binary
from lorapool_dev.image.recipe import TARGETS


@dataclass(frozen=True)
class Target:
    """A cluster to run the e2e against and the kubectl to talk to it."""

    kubeconfig: Path
    local: LocalCluster | None  # None: a real cluster whose pods run containers
    kubectl_bin: str
    node: RealNode | None = None  # the suite's own real node (a real cluster, built images)

    @property
    def real(self) -> bool:
        return self.local is None

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input_text, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}"
            )
        return result


def _kubectl_for_real_cluster() -> str:
    found = shutil.which("kubectl")
    if found:
        return found
    if not build.missing(cache_root(), ["kubectl"]):
        return str(binary("kubectl"))
    pytest.fail("LORAPOOL_E2E_KUBECONFIG is set but there is no kubectl on PATH nor a cached one")


@pytest.fixture(scope="session")
def e2e_target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kubeconfig = os.environ.get("LORAPOOL_E2E_KUBECONFIG")
    if kubeconfig:
        yield Target(Path(kubeconfig), None, _kubectl_for_real_cluster())
        return
    if _real_node_wanted():
        node: RealNode = request.getfixturevalue("real_node")
        # Before the chart and the pool: the pool's sidecars load and report under the policy.
        node.enforce_network_policy()
        yield Target(node.kubeconfig, None, str(binary("kubectl")), node)
        return
    local: LocalCluster = request.getfixturevalue("local_cluster")
    yield Target(local.kubeconfig, local, str(binary("kubectl")))


def keep() -> bool:
    return os.environ.get("LORAPOOL_E2E_KEEP") == "1"


def _real_node_wanted() -> bool:
    """The real node unless told `kwok`; where it cannot run, KWOK with the reason said, except
    under CI, where the `real_node` fixture then fails with that reason."""
    if os.environ.get("LORAPOOL_E2E_NODE", "real") == "kwok":
        return False
    problems = missing_prerequisites()
    if problems and not os.environ.get("CI"):
        print(f"tests/e2e on the KWOK-only control plane: a real node cannot run here: {'; '.join(problems)}")
        return False
    return True


def built_image(target: str) -> str:
    """The reference `lorapool image build` tags a Dockerfile target with (imported on the real node)."""
    return f"{TARGETS[target]}:{lorapool.__version__}"
