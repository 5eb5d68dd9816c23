"""The operator as a real process against the local control plane, running as its own
least-privilege ServiceAccount (TokenRequest token), never as cluster admin."""

from __future__ import annotations

import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.components import operator_argv
from lorapool_dev.testing.inferencepool_crd import NAME, inferencepool_crd
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


@dataclass
class OperatorProcess:
    """One `lorapool operator` subprocess and its endpoints."""

    proc: subprocess.Popen[bytes]
    metrics_port: int
    liveness_port: int
    log: Path

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
            self.proc.wait(timeout=20)


@pytest.fixture(scope="session")
def operator_env(local_cluster: LocalCluster) -> Path:
    """CRDs and the operator's RBAC installed; returns the ServiceAccount kubeconfig."""
    local_cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    local_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/lorapools.lorapool.io",
        "crd/loraadapters.lorapool.io",
    )
    local_cluster.kubectl("create", "namespace", "lorapool-system", check=False)
    local_cluster.kubectl("apply", "-f", str(REPO / "deploy" / "rbac.yaml"))
    return local_cluster.service_account_kubeconfig("lorapool-system", "lorapool-operator")


# Module scope, not session: the shared operator watches every namespace, so if it outlived its
# module it would reconcile the pools of the tests after it too (tests/e2e's pool got a second
# operator and flapped between their two writes: a random e2e failure, issue 20). Package scope is
# not enough: tests/ has no __init__.py, so pytest's "package" here is the whole session.
@pytest.fixture(scope="module")
def start_operator(
    operator_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(*extra: str, wait: bool = True) -> OperatorProcess:
        metrics, liveness = free_port(), free_port()
        log = tmp_path_factory.mktemp("operator") / "operator.log"
        fast = ["--resync-seconds", "3", "--metadata-timeout-seconds", "3", "--image", "lorapool:test"]
        cmd = operator_argv(
            kubeconfig=operator_env, metrics_port=metrics, liveness_port=liveness, extra=[*fast, *extra]
        )
        proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        op = OperatorProcess(proc, metrics, liveness, log)
        started.append(op)
        if wait:
            wait_until("operator leading", lambda: _ok(f"http://127.0.0.1:{liveness}/readyz") or _dead(op), 60)
            assert proc.poll() is None, log.read_text()[-3000:]
        return op

    yield start
    for op in started:
        op.stop(kill=True)
        print(f"--- {op.log} ---\n{op.log.read_text(errors='replace')[-4000:]}")  # shown when a test failed


@pytest.fixture(scope="module")
def _shared() -> dict[str, OperatorProcess]:
    return {}


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess], _shared: dict[str, OperatorProcess]) -> OperatorProcess:
    """The shared operator, restarted when a test killed it (the crash test does)."""
    current = _shared.get("op")
    if current is None or current.proc.poll() is not None:
        current = _shared["op"] = start_operator()
    return current


def _ok(url: str) -> bool:
    try:
        return bool(urllib.request.urlopen(url, timeout=2).status == 200)
    except OSError:
        return False


def _dead(op: OperatorProcess) -> bool:
    return op.proc.poll() is not None


@pytest.fixture(scope="session")
def admin(local_cluster: LocalCluster) -> Iterator[Any]:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def ns(local_cluster: LocalCluster) -> Iterator[str]:
    name = f"op-{uuid.uuid4().hex[:6]}"
    local_cluster.kubectl("create", "namespace", name)
    yield name
    local_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def install_inferencepool_crd(cluster: LocalCluster) -> None:
    result = cluster.kubectl(
        "apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(inferencepool_crd()), check=False
    )
    assert result.returncode == 0, result.stderr
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{NAME}")


def remove_inferencepool_crd(cluster: LocalCluster) -> None:
    cluster.kubectl("delete", "crd", NAME, "--ignore-not-found", "--wait=true", timeout_s=120)


@pytest.fixture(scope="module")
def no_inferencepool_crd(local_cluster: LocalCluster) -> Iterator[None]:
    """The CRD absent at the start (a cluster without GIE) and removed again at the end."""
    remove_inferencepool_crd(local_cluster)
    yield
    remove_inferencepool_crd(local_cluster)
