"""The real node (lorapool_dev.cluster.node): a kubelet that runs our images as pods, reached from the
root namespace only through kubectl, and a teardown that leaves this machine as it found it.

Marker `node`: root, containerd and runc; skips with the reason locally, fails under CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

import lorapool
from lorapool_dev.cluster import node_config
from lorapool_dev.cluster.node import RealNode, mounts_under, read_sysctls
from lorapool_dev.cluster.node_config import NODE_NAME
from lorapool_dev.cluster.pytest_plugin import require_real_node
from lorapool_dev.image.recipe import TARGETS
from lorapool_dev.testing.http import request
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.node, pytest.mark.slow]

SIM_IMAGE = f"{TARGETS['sim']}:{lorapool.__version__}"


def sim_pod(name: str) -> dict[str, Any]:
    """The sim image as the renderer runs an engine: non-root, read-only root, /tmp an emptyDir,
    a readiness probe, a projected ServiceAccount token, the downward API, a GPU."""
    serve = ["vllm", "serve", "tiny-model", "--host", "0.0.0.0", "--port", "8000", "--enable-lora", "--max-loras", "2"]
    container = {
        "name": "engine",
        "image": SIM_IMAGE,
        "imagePullPolicy": "Never",
        "command": serve,
        "ports": [{"containerPort": 8000}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "512Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "terminationGracePeriodSeconds": 1,
        },
    }


def pod(node: RealNode, name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(node.kubectl("get", "pod", name, "-o", "json").stdout)
    return result


def ready(node: RealNode, name: str) -> bool:
    conditions = pod(node, name).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.mark.timeout(420)
def test_a_sim_pod_runs_ready_on_the_real_node_and_answers_through_port_forward(real_node: RealNode) -> None:
    real_node.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(sim_pod("sim-0")))
    wait_until("pod sim-0 Ready on the real node", lambda: ready(real_node, "sim-0"), 90, interval_s=0.5)
    seen = pod(real_node, "sim-0")
    # Scheduled on the only untainted node that has GPUs: the real one, not a KWOK A100.
    assert seen["spec"]["nodeName"] == NODE_NAME
    assert seen["status"]["containerStatuses"][0]["ready"] is True
    assert seen["status"]["podIP"].startswith("10.250.16.")
    with real_node.port_forward("pod/sim-0", 8000) as url:
        models = request(f"{url}/v1/models", timeout_s=10).json()
        assert [m["id"] for m in models["data"]] == ["tiny-model"]
        reply = request(f"{url}/v1/completions", "POST", {"model": "tiny-model", "prompt": "hi", "max_tokens": 4})
        assert reply.status == 200 and reply.json()["choices"], reply.text
    real_node.kubectl("delete", "pod", "sim-0", "--wait=true", timeout_s=120)


def host_state() -> dict[str, Any]:
    """What a run must give back: namespaces, cgroups, mounts, sysctls and the kubelet's paths."""
    cgroups = sorted(str(p) for p in node_config.CGROUP_FS.glob("*/lorapool-*") if p.is_dir())
    netns = Path("/run/netns")
    return {
        "netns": sorted(os.listdir(netns)) if netns.is_dir() else None,
        "cgroups": cgroups,
        "sysctls": read_sysctls(),
        "host paths": {str(p): p.exists() for p in node_config.HOST_PATHS},
    }


def links_into(run_dir: Path) -> list[str]:
    """The kubelet's /var/log/containers symlinks into ``run_dir``: this run's, not another real node's
    (the session's node may be stopping pods of an earlier test meanwhile)."""
    logs = Path("/var/log/containers")
    return sorted(
        link.name for link in (logs.iterdir() if logs.is_dir() else ())
        if link.is_symlink() and os.readlink(link).startswith(f"{run_dir}/")
    )  # fmt: skip


def start_time(pid: int) -> str | None:
    """A process's start time in clock ticks (/proc/PID/stat field 22); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def exited(pid: int) -> bool:
    """Gone, or a zombie waiting for its parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


@pytest.mark.timeout(300)
def test_teardown_leaves_no_namespace_bridge_mount_cgroup_process_or_sysctl_change(tmp_path: Path) -> None:
    require_real_node()
    before = host_state()
    run_dir = tmp_path / "node"
    node = RealNode(run_dir, fake_nodes=())
    with node:
        pause = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pause"},
            "spec": {"containers": [{"name": "c", "image": node_config.PAUSE_IMAGE, "imagePullPolicy": "Never"}]},
        }
        node.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pause))
        wait_until("the pause pod Ready", lambda: ready(node, "pause"), 60, interval_s=0.5)
        pids = node.netns.pids()
        started = {pid: start_time(pid) for pid in pids}
        assert len(pids) >= 8, "control plane, containerd, shims, kubelet and kube-proxy run in the namespace"
        assert node.names.cgroup_root.lstrip("/") in " ".join(host_state()["cgroups"])
        assert mounts_under(run_dir), "the kubelet and containerd mount volumes and rootfs under the run dir"
        assert (run_dir / "logs" / "kubelet.log").is_file()
        assert links_into(run_dir), "the kubelet links the pause pod's log in /var/log/containers"
    assert host_state() == before
    assert links_into(run_dir) == []
    mounts = Path("/proc/self/mounts").read_text()
    assert str(run_dir) not in mounts and node.names.netns not in mounts
    assert not node.netns.exists()
    # The same process (pid and start time: a busy host reuses pids), still running (a zombie has ended).
    assert [pid for pid in pids if start_time(pid) == started[pid] and not exited(pid)] == []
    assert not run_dir.exists()
    if before["sysctls"]["vm/overcommit_memory"] != "1":  # else another real node runs: nothing to restore
        # The kubelet did rewrite VM-wide sysctls while it ran; they were put back.
        assert {"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} <= set(node.restored_sysctls)
