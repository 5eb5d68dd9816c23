"""Debian packages the tests and the bench install on first use, as root, as a fresh CI machine needs."""

from __future__ import annotations

import os
import shutil
import subprocess


def install(*packages: str) -> None:
    """``apt-get install`` ``packages``; a RuntimeError that says the command when we cannot (not root)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"missing {' '.join(packages)}: run `apt-get install -y {' '.join(packages)}` as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], env=env, check=True, capture_output=True)
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    subprocess.run(argv, env=env, check=True, capture_output=True)
