"""A private containerd, to import the image archives and run them as a node's runtime would.

Used by the images tests (and the real-node tier to come). Its root, state and socket live in
one temporary directory; the CRI plugin is off (nothing here is a kubelet), so it starts in
well under a second and touches no CNI. ``ctr run`` runs each container with runc, as the
image's own user, with the flags a pod's securityContext would give (read-only root, a tmpfs).
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lorapool_dev.testing.wait import WaitTimeout, wait_until

NAMESPACE = "k8s.io"  # the kubelet's namespace: an image imported here is what pods find

CONFIG = """version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{root}/containerd.sock"
"""


@dataclass(frozen=True)
class Containerd:
    """A running private containerd: ``ctr`` against its socket, in the kubelet's namespace."""

    root: Path
    process: subprocess.Popen[bytes]

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    def ctr(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def import_archive(self, archive: Path) -> None:
        result = self.ctr("images", "import", str(archive), timeout_s=300)
        if result.returncode != 0:
            raise RuntimeError(f"ctr images import {archive} failed: {result.stderr.strip()}")

    def run_argv(self, reference: str, name: str, command: Sequence[str], *, detach: bool = False) -> list[str]:
        """``ctr run`` as a pod with ``readOnlyRootFilesystem`` and an emptyDir on /tmp (HOME)."""
        mode = ["--detach"] if detach else ["--rm"]
        tmpfs = "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev:size=64m"
        return ["run", *mode, "--read-only", "--net-host", "--mount", tmpfs, reference, name, *command]

    def run(self, reference: str, name: str, command: Sequence[str], timeout_s: float = 120) -> str:
        """Run to completion; return stdout+stderr. Raises when it exits non-zero."""
        result = self.ctr(*self.run_argv(reference, name, command), timeout_s=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"{name}: {' '.join(command)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout + result.stderr

    def stop(self, name: str) -> None:
        """Kill a detached container's task and delete both (a no-op when they are gone)."""
        self.ctr("task", "kill", "--signal", "SIGKILL", name, timeout_s=30)

        def task_gone() -> bool:
            deleted = self.ctr("task", "delete", name, timeout_s=30).returncode == 0
            return deleted or name not in self.ctr("task", "ls", "--quiet", timeout_s=30).stdout.split()

        with contextlib.suppress(WaitTimeout):  # cleanup: the container delete below is tried either way
            wait_until(f"container {name}'s task deleted", task_gone, 20, interval_s=0.1)
        self.ctr("container", "delete", name, timeout_s=30)


def _mounts_under(root: Path) -> list[str]:
    """Mount points below ``root``, deepest first (a snapshot left mounted by a killed task)."""
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(f"{root}/")), key=len, reverse=True)


@contextlib.contextmanager
def running_containerd(start_timeout_s: float = 20) -> Iterator[Containerd]:
    """Start a containerd of our own; stop it and remove its directory on exit."""
    root = Path(tempfile.mkdtemp(prefix="lp-ctrd-", dir="/tmp"))  # short: the socket path has a limit
    (root / "config.toml").write_text(CONFIG.format(root=root))
    log = (root / "containerd.log").open("wb")
    process = subprocess.Popen(["containerd", "--config", str(root / "config.toml")], stdout=log, stderr=log)
    daemon = Containerd(root, process)
    try:

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"containerd exited: {(root / 'containerd.log').read_text()[-2000:]}")
            return daemon.ctr("version", timeout_s=10).returncode == 0

        wait_until("containerd to answer", answering, start_timeout_s, interval_s=0.1,
                   describe=lambda: (root / "containerd.log").read_text()[-2000:])  # fmt: skip
        yield daemon
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
        log.close()
        for point in _mounts_under(root):
            subprocess.run(["umount", point], capture_output=True, check=False)
        if not _mounts_under(root):  # never remove what is still mounted
            # rm, not shutil.rmtree: ~20k files after two imports, measured 5 s against up to 30 s
            subprocess.run(["rm", "-rf", "--one-file-system", str(root)], capture_output=True, check=False)
