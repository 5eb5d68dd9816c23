"""`lorapool cluster up/status/down` leave nothing behind: no process, no state, no kubeconfig."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.runtime import COMPONENTS

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def lorapool(*args: str, timeout_s: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def exited(pid: int) -> bool:
    """Gone, or a zombie waiting for init to reap it (`up` exited, so init is the parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.timeout(240)
def test_up_status_down_round_trip(tmp_path: Path) -> None:
    if build.missing(cache_root(), COMPONENTS):
        pytest.skip("control plane not built; run scripts/build-control-plane")
    state, kubeconfig = tmp_path / "state", tmp_path / "kubeconfig.yaml"

    up = lorapool("up", "--no-build", "--dir", str(state), "--kubeconfig", str(kubeconfig))
    try:
        assert up.returncode == 0, up.stderr
        assert kubeconfig.is_file()
        assert "Observed fake nodes Ready" in up.stderr

        status = lorapool("status", "--dir", str(state), timeout_s=30)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        processes = report["cluster"]["processes"]
        assert set(processes) == set(COMPONENTS)
        assert all(p["alive"] and p["healthy"] for p in processes.values()), processes
        pids = [p["pid"] for p in processes.values()]

        again = lorapool("up", "--no-build", "--dir", str(state), "--kubeconfig", str(kubeconfig), timeout_s=30)
        assert again.returncode == 0 and "already running" in again.stderr
    finally:
        down = lorapool("down", "--dir", str(state), timeout_s=90)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert exited(pid), f"pid {pid} survived `down`"
    assert not state.exists()
    assert not kubeconfig.exists()
    assert lorapool("status", "--dir", str(state), timeout_s=30).returncode == 3


@pytest.mark.timeout(30)
def test_up_refuses_to_overwrite_a_foreign_kubeconfig(tmp_path: Path) -> None:
    if build.missing(cache_root(), COMPONENTS):
        pytest.skip("control plane not built; run scripts/build-control-plane")
    foreign = tmp_path / "config"
    foreign.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: production\n")
    up = lorapool("up", "--no-build", "--dir", str(tmp_path / "state"), "--kubeconfig", str(foreign))
    assert up.returncode == 1
    assert "is not a lorapool kubeconfig" in up.stderr
    assert "production" in foreign.read_text()
