"""`lorapool dev --node real --once`, run as a user types it: every pod Ready on the real node, an
answered request, nothing left running (the leak plugin checks processes and ports too)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lorapool_dev.cluster.node_config import NODE_NAME
from lorapool_dev.cluster.pytest_plugin import require_real_node

pytestmark = [pytest.mark.node, pytest.mark.slow]


@pytest.mark.timeout(900)  # a cold image build is paid here when no other test built them first
def test_dev_on_the_real_node_once_prints_every_pod_ready_there_and_an_answer(tmp_path: Path) -> None:
    require_real_node()
    state = tmp_path / "dev"
    result = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "dev", "--node", "real", "--once", "--dir", str(state)],
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("NAMESPACE"))) + 1 :]
    pods = [line.split() for line in table[: table.index("")]]
    assert {p[0] for p in pods} == {"lorapool-system", "ml"}
    assert sum(1 for p in pods if "-engine-" in p[1]) == 2 and any("-router-" in p[1] for p in pods)
    for namespace, name, node, ready in pods:
        done, total = ready.split("/")
        assert node == NODE_NAME and done == total, f"{namespace}/{name} on {node}, {ready} ready"
    answer, _ = json.JSONDecoder().raw_decode(result.stdout, result.stdout.index("answered:\n") + len("answered:\n"))
    assert answer["model"] == "sql-coder" and answer["choices"][0]["text"]
    # A "Try it" block whose adapter the pods can fetch: served by the in-cluster server, not a host path.
    assert "Try it:" in result.stdout and str(state / "adapter.yaml") in result.stdout
    adapter = json.loads((state / "adapter.yaml").read_text())
    assert adapter["spec"]["source"].startswith("http://") and adapter["metadata"]["name"] == "my-adapter"
    assert not (state / "kubeconfig").exists() and not (state / "router-url").exists()
    assert not (state / "node").exists(), "the node's run directory is removed after a clean run"
