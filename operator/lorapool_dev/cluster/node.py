"""A real node beside the fake ones: kubelet, containerd and kube-proxy, with the control plane
that serves them, all inside one network namespace made for the run.

The shell behind the `node` test tier and `lorapool dev --node real`. `RealNode.start()` makes
the namespace (cluster/netns.py), a per-run cgroup root, starts a `LocalCluster` inside the
namespace (its API reachable from here through a loopback relay), containerd with the CRI
plugin, the kubelet and kube-proxy; imports the pause image (built here from 20 lines of Go)
and the given image archives; labels the node like an A100 node and advertises
`nvidia.com/gpu` by a status patch; and, unless told otherwise, taints the KWOK nodes so every
pod runs for real. `stop()` removes every process, mount, cgroup, namespace and sysctl change it
made, and keeps `logs/` when asked (a failed run). Pure configuration: `node_config`.

Needs root (namespaces, cgroups, mounts), containerd and runc on PATH (`lorapool image build`
installs them with apt-get), and the binaries `lorapool cluster build` caches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from lorapool.cache import cache_root
from lorapool_dev import gotool
from lorapool_dev.cluster import build, netns, netpol, node_config, pki
from lorapool_dev.cluster.health import http_ok
from lorapool_dev.cluster.manifests import DEFAULT_NODES, KWOK_ANNOTATION, FakeNode, kubeconfig
from lorapool_dev.cluster.node_config import NODE_IP, NODE_NAME, POD_SUBNET, NodeLayout, RunNames
from lorapool_dev.cluster.runtime import ClusterError, LocalCluster
from lorapool_dev.cluster.versions import CNI_PLUGINS, COMPONENTS, binary
from lorapool_dev.testing.wait import WaitTimeout, wait_until

log = logging.getLogger("lorapool_dev.cluster.node")

# What the node needs beyond the control plane, from the build cache.
NODE_BINARIES = ("kubelet", "kube-proxy", "crictl", *CNI_PLUGINS)
HOST_TOOLS = ("containerd", "runc", "ip", "iptables")
PAUSE_VERSION = "1"


class NodeError(ClusterError):
    """The real node could not be prepared, started or removed."""


def missing_prerequisites() -> list[str]:
    """What keeps a real node from starting here, in words; empty when it can start."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (network namespaces, cgroups and mounts need it)")
    tools = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if tools:
        problems.append(f"{', '.join(tools)} not on PATH (apt-get install containerd runc iproute2 iptables)")
    names = {c.name for c in COMPONENTS} - {"helm", netpol.NAME}  # the enforcer: built when asked for
    unbuilt = build.missing(cache_root(), sorted(names))
    if unbuilt:
        problems.append(f"{', '.join(c.key for c in unbuilt)} not built (run `lorapool cluster build`)")
    if gotool.go_binary() is None and not pause_binary().is_file():
        problems.append("go not found to build the pause image (install Go >= 1.26)")
    return problems


def pause_binary(root: Path | None = None) -> Path:
    return (root or cache_root()) / "bin" / f"pause-{PAUSE_VERSION}" / "pause"


def ensure_pause_binary() -> Path:
    """Build the sandbox binary once into the cache (Go, static), as the other binaries are."""
    target = pause_binary()
    if target.is_file():
        return target
    with build.build_lock(cache_root()):
        if target.is_file():
            return target
        source = Path(tempfile.mkdtemp(prefix=".tmp-pause-", dir=target.parent.parent))
        try:
            (source / "go.mod").write_text("module lorapool.local/pause\n\ngo 1.22\n")
            (source / "main.go").write_text(node_config.PAUSE_GO)
            gotool.run_go(["build", "-trimpath", "-ldflags=-s -w", "-o", "pause", "."], source, gotool.go_env())
            target.parent.mkdir(parents=True, exist_ok=True)
            (source / "pause").rename(target)
        finally:
            shutil.rmtree(source, ignore_errors=True)
    return target


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in node_config.HOST_SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def restore_sysctls(saved: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Write back every value that changed; return what was restored (name -> (seen, saved))."""
    restored = {}
    for name, value in saved.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            seen = path.read_text().strip()
            if seen != value:
                path.write_text(value)
                restored[name] = (seen, value)
    return restored


def cgroup_dirs(names: RunNames) -> list[Path]:
    """The run's cgroup root in every mounted v1 hierarchy (cgroup2's has no controllers here)."""
    roots = []
    for hierarchy in sorted(node_config.CGROUP_FS.iterdir()):
        if hierarchy.is_dir() and not hierarchy.is_symlink() and (hierarchy / "cgroup.procs").exists():
            roots.append(hierarchy / names.cgroup_root.lstrip("/"))
    return roots


def _make_cgroups(names: RunNames) -> None:
    """The kubelet wants its cgroup root to exist; cpuset's must hold CPUs and memory nodes
    before any child can, so copy the parent's."""
    for directory in cgroup_dirs(names):
        directory.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent = directory.parent / knob
            if parent.exists():
                (directory / knob).write_text(parent.read_text())


def _cgroup_pids(names: RunNames) -> set[int]:
    pids: set[int] = set()
    for directory in cgroup_dirs(names):
        for procs in directory.rglob("cgroup.procs") if directory.exists() else ():
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in procs.read_text().split()}
    return pids


def _remove_cgroups(names: RunNames) -> None:
    for directory in cgroup_dirs(names):
        if directory.exists():
            for child in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    child.rmdir()
            with contextlib.suppress(OSError):
                directory.rmdir()


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first."""
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    prefix = f"{root}/"
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _unmount_all(root: Path) -> None:
    for point in mounts_under(root):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class RealNode:
    """A control plane plus one real kubelet node, in a network namespace of this run's own.

    A context manager for tests; `kubeconfig` (admin) works from the root namespace.
    """

    def __init__(
        self,
        run_dir: Path,
        images: Sequence[Path] = (),
        fake_nodes: Sequence[FakeNode] = DEFAULT_NODES,
        taint_fake_nodes: bool = True,
        timeout_s: float = 240.0,
    ) -> None:
        self.names = RunNames(secrets.token_hex(4))
        self.layout = NodeLayout(run_dir.expanduser().resolve())
        self.images = tuple(images)
        self.taint_fake_nodes = taint_fake_nodes
        self.timeout_s = timeout_s
        self.netns = netns.Netns(self.names.netns)
        self.cluster = LocalCluster(
            self.layout.root / "control-plane",
            nodes=fake_nodes,
            netns=self.netns,
            advertise_address=NODE_IP,
        )
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._sysctls: dict[str, str] = {}
        self._created_host_paths: tuple[Path, ...] = ()
        self.restored_sysctls: dict[str, tuple[str, str]] = {}

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep_logs=exc_type is not None)

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, **kwargs)

    def crictl(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(binary("crictl")), f"--runtime-endpoint=unix://{self.layout.socket}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)

    @contextlib.contextmanager
    def port_forward(self, target: str, port: int, namespace: str = "default") -> Iterator[str]:
        """`kubectl port-forward` from the root namespace (through the API server and the
        kubelet's streaming, as a user's would); yields http://127.0.0.1:<local port>.

        A port-forward to a Service is bound to one of its pods and exits when that pod goes (a
        router restart, a roll): it is started again on the same local port while the context
        lasts, so the front door outlives the pod behind it."""
        forward = _Forward(self.kubeconfig, target, port, namespace)
        try:
            yield f"http://127.0.0.1:{forward.start()}"
        finally:
            forward.stop()

    # -- starting --------------------------------------------------------------------------

    def start(self) -> Self:
        problems = missing_prerequisites()
        if problems:
            raise NodeError(f"a real node cannot start here: {'; '.join(problems)}")
        started = time.monotonic()
        try:
            self._sysctls = read_sysctls()
            self._created_host_paths = tuple(p for p in node_config.HOST_PATHS if not p.exists())
            netns.create(self.names.netns, NODE_IP)
            _make_cgroups(self.names)
            self.cluster.start()
            self._write_files()
            self._start_containerd()
            self._start_kubelet()
            self._start_kube_proxy()
            if self.taint_fake_nodes and self.cluster.nodes:
                self._taint_fake_nodes()
        except BaseException:
            self.stop(keep_logs=True)
            raise
        log.info(
            "Started real node name=%s netns=%s seconds=%.1f", NODE_NAME, self.names.netns, time.monotonic() - started
        )
        return self

    def _write_files(self) -> None:
        layout, cp = self.layout, self.cluster.layout
        for directory in (layout.logs, layout.pki, layout.cni_bin, layout.cni_conf, layout.kubelet, layout.containerd):
            directory.mkdir(parents=True, exist_ok=True)
        ca = pki.KeyPair(cp.cert("ca").read_bytes(), cp.key("ca").read_bytes())
        pairs = {
            "kubelet-client": pki.issue(ca, f"system:node:{NODE_NAME}", ("system:nodes",)),
            "kubelet": pki.issue(ca, NODE_NAME, server_names=(NODE_NAME, NODE_IP), client=False),
            "kube-proxy": pki.issue(ca, "system:kube-proxy", ("system:node-proxier",)),
        }
        for name, pair in pairs.items():
            (layout.pki / f"{name}.crt").write_bytes(pair.cert_pem)
            (layout.pki / f"{name}.key").write_bytes(pair.key_pem)
            (layout.pki / f"{name}.key").chmod(0o600)
        for user, pair_name in (("kubelet", "kubelet-client"), ("kube-proxy", "kube-proxy")):
            config = kubeconfig(
                self.cluster.server,
                cp.cert("ca"),
                user,
                cert_file=layout.pki / f"{pair_name}.crt",
                key_file=layout.pki / f"{pair_name}.key",
            )
            (layout.root / f"{user}.kubeconfig").write_text(yaml.safe_dump(config, sort_keys=False))
        for plugin in CNI_PLUGINS:
            shutil.copy2(binary(plugin), layout.cni_bin / plugin)
        cni = node_config.cni_config(self.names, layout)
        (layout.cni_conf / "10-lorapool.conflist").write_text(json.dumps(cni, indent=2))
        (layout.root / "containerd.toml").write_text(node_config.containerd_config(layout))
        # No nameserver: pods resolve nothing rather than ask one of this machine's.
        (layout.root / "resolv.conf").write_text("options ndots:1\n")
        kubelet = node_config.kubelet_config(self.names, layout, cp.cert("ca"))
        (layout.root / "kubelet.yaml").write_text(yaml.safe_dump(kubelet, sort_keys=False))
        proxy = node_config.kube_proxy_config(layout.root / "kube-proxy.kubeconfig")
        (layout.root / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy, sort_keys=False))
        (layout.root / "pause.tar").write_bytes(node_config.pause_archive(ensure_pause_binary().read_bytes()))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        def preexec() -> None:
            self.netns.enter()
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with us

        log_path = self.layout.logs / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.layout.root,
                preexec_fn=preexec,
            )
        self._procs[name] = popen
        log.info("Started %s pid=%d log=%s", name, popen.pid, log_path)
        return popen

    def _wait(self, what: str, done: Callable[[], bool], timeout_s: float | None = None) -> None:
        def check() -> bool:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise NodeError(
                        f"{name} exited while waiting for {what}; see {self.layout.logs / name}.log:\n{self._tail(name)}"
                    )
            return done()

        started = time.monotonic()
        try:
            wait_until(what, check, timeout_s or self.timeout_s, interval_s=0.25)
        except WaitTimeout:
            tails = "\n".join(f"--- {name}\n{self._tail(name)}" for name in self._procs)
            raise NodeError(f"timed out waiting for {what}; logs:\n{tails}") from None
        log.info("Observed %s seconds=%.1f", what, time.monotonic() - started)

    def _tail(self, name: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.layout.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def _start_containerd(self) -> None:
        self._spawn("containerd", ["containerd", "--config", str(self.layout.root / "containerd.toml")])
        self._wait("containerd's CRI to answer", lambda: self.crictl("info", timeout_s=10).returncode == 0, 30)
        for archive in (self.layout.root / "pause.tar", *self.images):
            self._import(archive)

    def _import(self, archive: Path) -> None:
        started = time.monotonic()
        cmd = ["ctr", "--address", str(self.layout.socket), "--namespace", "k8s.io", "images", "import", str(archive)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if result.returncode != 0:
            raise NodeError(f"importing {archive} into the node's containerd failed: {result.stderr.strip()}")
        log.info("Imported image archive=%s seconds=%.1f", archive, time.monotonic() - started)

    def _start_kubelet(self) -> None:
        args = node_config.kubelet_args(self.layout, self.layout.root / "kubelet.kubeconfig")
        self._spawn("kubelet", [str(binary("kubelet")), *args])
        self._wait(f"Node {NODE_NAME} Ready", self._node_ready)
        labels = [f"{k}={v}" for k, v in node_config.node_labels().items()]
        self.kubectl("label", "node", NODE_NAME, "--overwrite", *labels)
        patch = json.dumps(node_config.gpu_status_patch())
        self.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge", "-p", patch)
        self._wait("nvidia.com/gpu allocatable on the real node", self._gpus_allocatable, 60)

    def _node(self) -> dict[str, Any] | None:
        result = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False, timeout_s=20)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def _node_ready(self) -> bool:
        node = self._node()
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _gpus_allocatable(self) -> bool:
        node = self._node() or {}
        return bool(node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu") == "8")

    def _start_kube_proxy(self) -> None:
        config = self.layout.root / "kube-proxy.yaml"
        self._spawn("kube-proxy", [str(binary("kube-proxy")), f"--config={config}", "--v=1"])

        def healthy() -> bool:
            with self.netns.entered():  # kube-proxy's healthz listens on the namespace's loopback
                return http_ok("http://127.0.0.1:10256/healthz")

        self._wait("kube-proxy healthy", healthy, 60)

    def enforce_network_policy(self) -> None:
        """Start kube-network-policies (cluster/netpol.py) on the running node, once: from then on
        every NetworkPolicy is enforced here. Not at start: only the tiers that test policies ask."""
        if (running := self._procs.get(netpol.NAME)) is not None and running.poll() is None:
            return
        self.stop_network_policy()  # a dead one's table goes first
        ca, server = self.cluster.layout.cert("ca"), self.cluster.server
        argv = netpol.prepare(self.netns, self.kubectl, self.layout.root / "netpol", ca, server, NODE_NAME, POD_SUBNET)
        proc = self._spawn(netpol.NAME, argv)
        self._wait(f"{netpol.NAME} enforcing pid={proc.pid}", lambda: netpol.enforcing(self.netns), 90)

    def stop_network_policy(self) -> None:
        """Stop enforcing: end kube-network-policies; its nftables table and our iptables diversion go too."""
        if (proc := self._procs.pop(netpol.NAME, None)) is not None:
            netpol.stop(proc)
            log.info("Stopped %s pid=%d", netpol.NAME, proc.pid)
        netpol.remove_diversion(self.netns)
        if netpol.remove_table(self.netns):
            log.warning("Removed nftables table table=inet %s reason=%s", netpol.TABLE, "left by the enforcer")

    def _taint_fake_nodes(self) -> None:
        taint = node_config.FAKE_NODE_TAINT
        spec = f"{taint['key']}={taint['value']}:{taint['effect']}"
        self.kubectl("taint", "nodes", "-l", "type=kwok", spec, "--overwrite")
        log.info("Tainted KWOK nodes taint=%s annotation=%s", spec, KWOK_ANNOTATION)

    # -- faults (tests/node/test_faults_real.py) ---------------------------------------------

    def stop_kubelet(self) -> None:
        """Stop the kubelet alone (its pods keep running), as a crashed or upgrading kubelet does."""
        self._terminate("kubelet")

    def start_kubelet(self) -> None:
        """Start the kubelet again; returns once the node is Ready with its GPUs advertised."""
        self._start_kubelet()

    # -- stopping --------------------------------------------------------------------------

    def stop(self, keep_logs: bool = False) -> None:
        """End everything the node runs and remove what it made; idempotent."""
        self.stop_network_policy()
        for name in ("kube-proxy", "kubelet"):
            self._terminate(name)
        if (proc := self._procs.get("containerd")) is not None and proc.poll() is None:
            result = self.crictl("rmp", "--force", "--all", timeout_s=120)  # sandboxes, their netns and CNI state
            if result.returncode != 0:
                log.warning("Failed to remove pod sandboxes error=%s", result.stderr.strip()[:300])
        self._terminate("containerd")
        self.cluster.stop()
        for pids in (self.netns.pids, lambda: sorted(_cgroup_pids(self.names))):
            _kill(pids())
            with contextlib.suppress(WaitTimeout):
                wait_until("the node's processes to exit", lambda: not pids(), 20, interval_s=0.1)  # noqa: B023
        _unmount_all(self.layout.root)
        _remove_cgroups(self.names)
        netns.delete(self.netns)
        self._remove_host_leftovers()
        self.restored_sysctls |= restore_sysctls(self._sysctls)
        if self.restored_sysctls:
            log.info("Restored sysctls %s", self.restored_sysctls)
        self._remove_files(keep_logs)

    def _remove_host_leftovers(self) -> None:
        """What the kubelet wrote outside the run dir: log symlinks into this run's pod logs,
        its device-plugin socket when this run made the directory; then the empty directories
        this run made."""
        logs = Path("/var/log/containers")
        for link in logs.iterdir() if logs.is_dir() else ():
            if link.is_symlink() and os.readlink(link).startswith(f"{self.layout.root}/"):
                link.unlink(missing_ok=True)
        if Path("/var/lib/kubelet") in self._created_host_paths:
            node_config.DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
        for path in self._created_host_paths:
            if path.is_dir() and not any(path.iterdir()):
                if str(path) in mounts_under(path.parent):  # `ip netns` bind-mounts /run/netns on itself
                    subprocess.run(["umount", str(path)], capture_output=True, check=False)
                with contextlib.suppress(OSError):
                    path.rmdir()

    def _terminate(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.info("Stopped %s pid=%d", name, proc.pid)

    def _remove_files(self, keep_logs: bool) -> None:
        if mounts_under(self.layout.root):
            log.warning("Kept run directory path=%s reason=%s", self.layout.root, "mounts remain")
            return
        root = self.layout.root
        for entry in root.iterdir() if root.exists() else ():
            if keep_logs and entry.name in ("logs", "control-plane"):
                continue
            if entry.is_dir() and not entry.is_symlink():
                subprocess.run(["rm", "-rf", "--one-file-system", str(entry)], capture_output=True, check=False)
            else:
                entry.unlink(missing_ok=True)
        if not keep_logs:
            with contextlib.suppress(OSError):
                root.rmdir()


@contextlib.contextmanager
def real_node(run_dir: Path, images: Sequence[Path] = (), **kwargs: Any) -> Iterator[RealNode]:
    with RealNode(run_dir, images, **kwargs) as node:
        yield node


class _Forward:
    """One supervised `kubectl port-forward`: started again on its local port whenever it exits."""

    RESTART_PAUSE_S = 0.5  # between a forward's exit and its restart (the Service's next pod may be starting)

    def __init__(self, kubeconfig: Path, target: str, port: int, namespace: str) -> None:
        self.argv = [str(binary("kubectl")), f"--kubeconfig={kubeconfig}", "-n", namespace, "port-forward"]
        self.argv += ["--address=127.0.0.1", target]
        self.target, self.port = target, port
        self.local = 0  # chosen by the first forward, kept by the next ones
        self.restarts = 0
        self._proc: subprocess.Popen[str] | None = None
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name=f"port-forward {target}", daemon=True)

    def start(self) -> int:
        self._proc = self._open()
        self._supervisor.start()
        return self.local

    def _open(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [*self.argv, f"{self.local or ''}:{self.port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> PORT"; EOF if it failed
        if not line.startswith("Forwarding from 127.0.0.1:"):
            proc.kill()
            raise NodeError(f"kubectl port-forward {self.target} :{self.port} failed: {line}{proc.communicate()[1]}")
        self.local = int(line.split(":", 2)[1].split()[0])
        # kubectl writes a line per connection: read them, or a full pipe stalls the forward.
        lines = proc.stdout
        threading.Thread(target=deque, args=(lines, 0), name="port-forward output", daemon=True).start()
        return proc

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            assert self._proc is not None
            self._proc.wait()
            while not self._stopping.wait(self.RESTART_PAUSE_S):
                try:
                    self._proc = self._open()
                except NodeError:
                    continue  # no ready pod behind the Service yet: try again
                self.restarts += 1
                break

    def stop(self) -> None:
        self._stopping.set()
        _end(self._proc)  # the supervisor wakes from its wait and sees the stop
        self._supervisor.join(15)
        _end(self._proc)  # one it opened while the stop came


def _end(proc: subprocess.Popen[str] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
