"""The Go toolchain as the dev wing uses it: `go` found, its environment, a run that streams or
captures. Called by the control-plane build (cluster.build, cluster.node) and the Gateway API
CRDs' download (testing.gateway_api); the ground of lorapool_dev, importing nothing of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def go_env() -> dict[str, str]:
    """Static binaries (no cgo, as the Kubernetes release builds them) from the proxy only."""
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def go_binary() -> str | None:
    """`go` from PATH, else the standard install location (CI's PATH may lack it)."""
    return shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")


def run_go(args: Sequence[str], cwd: Path, env: dict[str, str]) -> None:
    """Run go, streaming its output (the `go: downloading` lines are the progress)."""
    print(f"[lorapool go] Running go {' '.join(args)} cwd={cwd}", file=sys.stderr, flush=True)
    result = subprocess.run([go_binary() or "go", *args], cwd=cwd, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"go {' '.join(args)} failed with exit code {result.returncode} in {cwd}")


def go_output(args: Sequence[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run([go_binary() or "go", *args], cwd=cwd, env=env, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"go {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout
