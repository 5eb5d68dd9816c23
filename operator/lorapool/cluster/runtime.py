"""Run the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and KWOK as background processes on 127.0.0.1, with fake A100 nodes.

The shell behind `lorapool cluster up/down/status` and the `LocalCluster` API that tests use.
It writes a state directory (certificates, kubeconfigs, etcd data, logs, `cluster.json` with
pids and ports) and talks to the apiserver through one small HTTPS seam (`_Api`), so the
operator's own client library is not needed to bring a cluster up.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from lorapool.cache import cache_root
from lorapool.cluster import build, manifests, pki
from lorapool.cluster.manifests import DEFAULT_NODES, LOOPBACK, FakeNode, Layout, Ports
from lorapool.cluster.netns import Netns, Relay
from lorapool.cluster.versions import binary
from lorapool.testing.processes import free_ports
from lorapool.testing.wait import WaitTimeout, wait_until

log = logging.getLogger("lorapool.cluster")

# Start order; stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Starts to try when a component finds its port taken (see LocalCluster.start).
PORT_ATTEMPTS = 3
# Everything `down` may delete inside a state directory: never more, so a mistyped --dir
# (say, $HOME) loses nothing that the cluster did not create.
OWNED = ("pki", "logs", "etcd", "kubeconfig", "stages.yaml", "cluster.json")


class ClusterError(RuntimeError):
    """The local control plane could not be built, started, reached or stopped."""


def default_state_dir() -> Path:
    return cache_root() / "cluster"


@dataclass
class _Process:
    name: str
    pid: int
    binary: str
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False  # exited; waiting for its parent (init, once `up` returned) to reap it
        # Guards against a recycled pid: only our binary counts as ours.
        return cmdline.split(b"\0", 1)[0].decode(errors="replace") == self.binary

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class _Api:
    """Minimal HTTPS client for the apiserver: mutual TLS with the admin certificate."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server
        self._ctx = ssl.create_default_context(cafile=str(ca))
        self._ctx.load_cert_chain(str(cert), str(key))

    def request(self, method: str, path: str, body: Any = None, timeout_s: float = 10.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout_s) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read())


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(raw)


def _https_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Components serve /healthz with self-signed certs; only the answer matters here."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class LocalCluster:
    """A real control plane on loopback with fake GPU nodes; a context manager for tests.

    `start()` returns once the API is ready, the default ServiceAccount exists and every fake
    node is Ready; `stop()` ends the processes it started and deletes the state directory.
    Unless `detach` (what `lorapool cluster up` uses), the processes are also killed when the
    Python process that started them dies, so a killed test run leaks no cluster (Linux
    ties that to the starting thread: call `start()` from a thread that lives as long, e.g.
    the main one, not from a short-lived worker thread).
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        kubeconfig: Path | None = None,
        nodes: Sequence[FakeNode] = DEFAULT_NODES,
        timeout_s: float = 120.0,
        detach: bool = False,
        netns: Netns | None = None,
        advertise_address: str = LOOPBACK,
    ) -> None:
        self.layout = Layout((state_dir or default_state_dir()).expanduser().resolve())
        self._kubeconfig = (kubeconfig or self.layout.component_kubeconfig("admin")).expanduser()
        self.nodes = tuple(nodes)
        self.timeout_s = timeout_s
        self.detach = detach
        self.ports: Ports | None = None
        self._procs: dict[str, _Process] = {}
        # With a namespace (the real node, cluster/node.py), every component runs inside it and
        # advertises `advertise_address` to pods; root-namespace clients reach the API through
        # a Relay on the same port, so every kubeconfig works on both sides.
        self.netns = netns
        self.advertise_address = advertise_address
        self._relay: Relay | None = None

    # -- public surface --------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (client cert in group system:masters)."""
        return self._kubeconfig

    @property
    def server(self) -> str:
        if self.ports is None:
            raise ClusterError("the cluster is not running: call start() first")
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        missing = build.missing(cache_root(), COMPONENTS)
        if missing:
            raise ClusterError(
                "control-plane binaries are not built: "
                f"{', '.join(c.key for c in missing)}; run `lorapool cluster build` "
                "(or scripts/build-control-plane) first, it takes ~25 min once"
            )
        if self._running_state() is not None:
            raise ClusterError(
                f"a cluster is already running from {self.layout.root}; "
                f"run `lorapool cluster down --dir {self.layout.root}` first"
            )
        if self._external_kubeconfig() and self._kubeconfig.exists() and not _is_ours(self._kubeconfig):
            raise ClusterError(
                f"{self._kubeconfig} exists and is not a lorapool kubeconfig; pass another --kubeconfig "
                "path (this one would be overwritten, then deleted by `down`)"
            )
        self._remove_state()
        started = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                with self.netns.entered() if self.netns else contextlib.nullcontext():
                    self._start(started)
                if self.netns is not None:
                    assert self.ports is not None
                    self._relay = Relay(self.netns, self.ports.apiserver)
                break
            except ClusterError as err:
                self.stop()
                # Free ports are picked, released, then bound by the components: another
                # cluster starting at the same moment can take one in between. Retry that.
                if "address already in use" not in str(err) or attempt == PORT_ATTEMPTS:
                    raise
                log.warning("Retrying cluster start reason=%s attempt=%d", "port taken", attempt)
            except BaseException:
                self.stop()
                raise
        log.info(
            "Started local cluster server=%s kubeconfig=%s seconds=%.1f",
            self.server,
            self.kubeconfig,
            time.monotonic() - started,
        )
        return self

    def stop(self) -> None:
        """Stop every process this cluster runs (also ones a previous `up` left) and delete
        its state; the kubeconfig written outside the state dir goes too."""
        if not self._procs:
            self._load_state()
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        for name in reversed(COMPONENTS):
            proc = self._procs.pop(name, None)
            if proc is not None:
                _terminate(proc)
        if self._external_kubeconfig() and _is_ours(self._kubeconfig):
            self._kubeconfig.unlink(missing_ok=True)
        self._remove_state()
        self.ports = None

    def restart(self, *names: str) -> None:
        """Stop the named components (etcd, kube-apiserver, ...) and start them again with the
        same flags, ports and data, in dependency order; returns once the API answers again.

        For fault tests: what a running operator sees when its API server or etcd goes away."""
        if self.ports is None:
            raise ClusterError("the cluster is not running: call start() first")
        unknown = set(names) - set(COMPONENTS)
        if unknown:
            raise ClusterError(f"unknown component(s) {sorted(unknown)}; choose from {', '.join(COMPONENTS)}")
        for name in reversed(COMPONENTS):
            if name in names and (proc := self._procs.pop(name, None)) is not None:
                _terminate(proc)
        ports, layout = self.ports, self.layout
        args = {
            "etcd": lambda: manifests.etcd_args(layout, ports),
            "kube-apiserver": lambda: manifests.apiserver_args(layout, ports, self.advertise_address),
            "kube-controller-manager": lambda: manifests.controller_manager_args(layout, ports),
            "kube-scheduler": lambda: manifests.scheduler_args(layout, ports),
            "kwok": lambda: manifests.kwok_args(layout, layout.root / "stages.yaml"),
        }
        deadline = time.monotonic() + self.timeout_s
        for name in COMPONENTS:
            if name in names:
                self._spawn(name, args[name]())
        api = self._api()
        self._wait("kube-apiserver ready after a restart", deadline, lambda: self._ready(api))

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        path: Path | None = None,
        expiration_s: int = 3600,
        bound_pod: tuple[str, str] | None = None,
    ) -> Path:
        """Mint a token for an existing ServiceAccount with the TokenRequest API and write a
        kubeconfig that uses it, so code can be tested with exactly that account's RBAC.

        ``bound_pod`` (name, uid) binds the token to that Pod (it must run as this account), as the kubelet
        binds the tokens it projects: the API server then authenticates it with the Pod's name in
        ``authentication.kubernetes.io/pod-name`` (and only while that Pod exists)."""
        spec: dict[str, Any] = {"expirationSeconds": max(expiration_s, 600)}
        if bound_pod is not None:
            pod_name, pod_uid = bound_pod
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod_name, "uid": pod_uid}
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        status, answer = self._api().request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body
        )
        if status != 201:
            raise ClusterError(
                f"TokenRequest for ServiceAccount {namespace}/{name} failed with HTTP {status}: {_message(answer)}"
            )
        suffix = f"-{bound_pod[0]}" if bound_pod is not None else ""
        target = path or self.layout.component_kubeconfig(f"sa-{namespace}-{name}{suffix}")
        config = manifests.kubeconfig(
            self.server,
            self.layout.cert("ca"),
            f"system:serviceaccount:{namespace}:{name}",
            token=answer["status"]["token"],
            namespace=namespace,
        )
        _write(target, yaml.safe_dump(config, sort_keys=False), 0o600)
        log.info("Wrote ServiceAccount kubeconfig serviceAccount=%s/%s path=%s", namespace, name, target)
        return target

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input_text: str | None = None,
        check: bool = True,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the cached kubectl against this cluster (admin unless `kubeconfig` is given)."""
        cmd = [str(binary("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        return subprocess.run(cmd, input=input_text, capture_output=True, text=True, check=check, timeout=timeout_s)

    def status(self) -> dict[str, Any]:
        """Processes, their liveness and component health, for `lorapool cluster status`."""
        state = self._load_state()
        if state is None:
            return {"running": False, "state_dir": str(self.layout.root)}
        assert self.ports is not None
        health = {
            "etcd": _http_ok(f"http://127.0.0.1:{self.ports.etcd_client}/health"),
            "kube-apiserver": _https_ok(f"{self.server}/readyz"),
            "kube-controller-manager": _https_ok(f"https://127.0.0.1:{self.ports.controller_manager}/healthz"),
            "kube-scheduler": _https_ok(f"https://127.0.0.1:{self.ports.scheduler}/healthz"),
        }
        procs = {
            name: {"pid": p.pid, "alive": p.alive(), "healthy": health.get(name, p.alive()), "log": str(p.log)}
            for name, p in self._procs.items()
        }
        return {
            "running": all(p["alive"] for p in procs.values()),
            "server": self.server,
            "kubeconfig": state["kubeconfig"],
            "state_dir": str(self.layout.root),
            "processes": procs,
        }

    @classmethod
    def attach(cls, state_dir: Path | None = None) -> LocalCluster:
        """The cluster a previous `up` left running in `state_dir` (for down and status)."""
        cluster = cls(state_dir)
        state = cluster._load_state()
        if state is not None:
            cluster._kubeconfig = Path(state["kubeconfig"])
        return cluster

    # -- starting --------------------------------------------------------------------------

    def _start(self, started: float) -> None:
        layout = self.layout
        for directory in (layout.pki, layout.logs, layout.kubeconfigs):
            directory.mkdir(parents=True, exist_ok=True)
        layout.pki.chmod(0o700)
        self.ports = ports = Ports(*free_ports(5))
        self._write_pki()
        self._write_kubeconfigs()
        stages = layout.root / "stages.yaml"
        _write(stages, resources.files("lorapool.cluster").joinpath("stages.yaml").read_text())

        deadline = started + self.timeout_s
        self._spawn("etcd", manifests.etcd_args(layout, ports))
        self._wait("etcd healthy", deadline, lambda: _http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"))
        self._spawn("kube-apiserver", manifests.apiserver_args(layout, ports, self.advertise_address))
        api = self._api()
        self._wait("kube-apiserver ready", deadline, lambda: self._ready(api))
        self._spawn("kube-controller-manager", manifests.controller_manager_args(layout, ports))
        self._spawn("kube-scheduler", manifests.scheduler_args(layout, ports))
        self._spawn("kwok", manifests.kwok_args(layout, stages))

        for node in self.nodes:
            status, answer = api.request("POST", "/api/v1/nodes", node.manifest())
            if status not in (201, 409):
                raise ClusterError(f"creating Node {node.name} failed with HTTP {status}: {_message(answer)}")
            log.info("Created Node name=%s gpuProduct=%s", node.name, node.gpu_product or "-")
        names = {n.name for n in self.nodes}
        self._wait("fake nodes Ready", deadline, lambda: self._nodes_ready(api, names))
        self._wait(
            "default ServiceAccount",
            deadline,
            lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        )
        self._wait(
            "kube-scheduler healthy", deadline, lambda: _https_ok(f"https://127.0.0.1:{ports.scheduler}/healthz")
        )
        self._wait(
            "kube-controller-manager healthy",
            deadline,
            lambda: _https_ok(f"https://127.0.0.1:{ports.controller_manager}/healthz"),
        )

    def _external_kubeconfig(self) -> bool:
        return not self._kubeconfig.resolve().is_relative_to(self.layout.root)

    def _write_pki(self) -> None:
        layout = self.layout
        ca = pki.new_ca()
        front_proxy_ca = pki.new_ca("lorapool-front-proxy-ca")
        pairs = {
            "ca": ca,
            "apiserver": pki.issue(
                ca,
                "kube-apiserver",
                server_names=(
                    "127.0.0.1",
                    *([self.advertise_address] if self.advertise_address != LOOPBACK else []),
                    "localhost",
                    manifests.KUBERNETES_SERVICE_IP,
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    f"kubernetes.default.svc.{manifests.CLUSTER_DOMAIN}",
                ),
            ),
            "admin": pki.issue(ca, "lorapool-admin", ("system:masters",)),
            # How the API server authenticates to kubelets (logs, exec, port-forward).
            "apiserver-kubelet-client": pki.issue(ca, "kube-apiserver-kubelet-client", ("system:masters",)),
            "kube-controller-manager": pki.issue(ca, "system:kube-controller-manager"),
            "kube-scheduler": pki.issue(ca, "system:kube-scheduler"),
            # kwok writes status for every node and pod it fakes, which no narrow built-in
            # role grants; on a throwaway cluster it runs as an admin.
            "kwok": pki.issue(ca, "kwok-controller", ("system:masters",)),
            "sa": pki.new_service_account_key(),
            "front-proxy-ca": front_proxy_ca,
            "front-proxy-client": pki.issue(front_proxy_ca, "front-proxy-client"),
        }
        for name, pair in pairs.items():
            _write(layout.key(name), pair.key_pem, 0o600)
            if name == "sa":
                _write(layout.pki / "sa.pub", pair.cert_pem)
            else:
                _write(layout.cert(name), pair.cert_pem)

    def _write_kubeconfigs(self) -> None:
        for user in ("admin", "kube-controller-manager", "kube-scheduler", "kwok"):
            config = manifests.kubeconfig(
                self.server,
                self.layout.cert("ca"),
                user,
                cert_file=self.layout.cert(user),
                key_file=self.layout.key(user),
            )
            text = yaml.safe_dump(config, sort_keys=False)
            _write(self.layout.component_kubeconfig(user), text, 0o600)
            if user == "admin" and self._kubeconfig != self.layout.component_kubeconfig(user):
                _write(self._kubeconfig, text, 0o600)

    def _spawn(self, name: str, args: list[str]) -> None:
        exe = str(binary(name))
        log_path = self.layout.logs / f"{name}.log"
        with log_path.open("ab") as out:
            # A new session: a Ctrl-C meant for the caller does not reach the control plane;
            # `stop()` / `down` end it by pid.
            popen = subprocess.Popen(
                [exe, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.layout.root,
                preexec_fn=self._preexec(),
            )
        self._procs[name] = _Process(name, popen.pid, exe, log_path, popen)
        self._save_state()  # at once: if this process dies now, `down` still finds the pid
        log.info("Started %s pid=%d log=%s", name, popen.pid, log_path)

    def _preexec(self) -> Callable[[], None] | None:
        """What a component's child runs before exec: join the namespace, die with us."""
        steps = [*([self.netns.enter] if self.netns else []), *([] if self.detach else [_die_with_parent])]
        if not steps:
            return None

        def run() -> None:
            for step in steps:
                step()

        return run

    def _wait(self, what: str, deadline: float, done: Callable[[], bool]) -> None:
        began = time.monotonic()

        def check() -> bool:
            for proc in self._procs.values():
                if not proc.alive():  # not retried: a dead component will not come back by itself
                    raise ClusterError(
                        f"{proc.name} exited while waiting for {what}; last lines of {proc.log}:\n{proc.log_tail()}"
                    )
            return done()

        try:
            wait_until(what, check, max(0.0, deadline - began), interval_s=0.1)
        except WaitTimeout:
            tails = "\n".join(f"--- {p.log}\n{p.log_tail(10)}" for p in self._procs.values())
            raise ClusterError(
                f"timed out after {self.timeout_s:.0f}s waiting for {what}; component logs:\n{tails}"
            ) from None
        log.info("Observed %s seconds=%.1f", what, time.monotonic() - began)

    def _api(self) -> _Api:
        return _Api(self.server, self.layout.cert("ca"), self.layout.cert("admin"), self.layout.key("admin"))

    @staticmethod
    def _ready(api: _Api) -> bool:
        try:
            return api.request("GET", "/readyz", timeout_s=2.0)[0] == 200
        except OSError:
            return False

    @staticmethod
    def _nodes_ready(api: _Api, names: set[str]) -> bool:
        status, answer = api.request("GET", "/api/v1/nodes")
        if status != 200:
            return False
        ready = {n["metadata"]["name"] for n in answer["items"] if _node_ready(n)}
        return names <= ready

    # -- state -----------------------------------------------------------------------------

    def _save_state(self) -> None:
        assert self.ports is not None
        state = {
            "server": self.server,
            "kubeconfig": str(self._kubeconfig),
            "ports": vars(self.ports),
            "processes": {n: {"pid": p.pid, "binary": p.binary, "log": str(p.log)} for n, p in self._procs.items()},
        }
        _write(self.layout.state_file, json.dumps(state, indent=2) + "\n")

    def _load_state(self) -> dict[str, Any] | None:
        try:
            state: dict[str, Any] = json.loads(self.layout.state_file.read_text())
        except (OSError, ValueError):
            return None
        self.ports = Ports(**state["ports"])
        for name, entry in state["processes"].items():
            if name not in self._procs:
                self._procs[name] = _Process(name, entry["pid"], entry["binary"], Path(entry["log"]))
        return state

    def _running_state(self) -> dict[str, Any] | None:
        probe = LocalCluster(self.layout.root)
        state = probe._load_state()
        if state is not None and any(p.alive() for p in probe._procs.values()):
            return state
        return None

    def _remove_state(self) -> None:
        for name in OWNED:
            path = self.layout.root / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.layout.root.rmdir()  # only if nothing else lives there


def _is_ours(kubeconfig: Path) -> bool:
    """A kubeconfig this module wrote (its only cluster is lorapool-local)."""
    try:
        config = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError):
        return False
    clusters = config.get("clusters") if isinstance(config, dict) else None
    return isinstance(clusters, list) and [c.get("name") for c in clusters] == ["lorapool-local"]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG).

    KILL, not TERM: all components get it at once, and kube-apiserver's graceful shutdown
    hangs once etcd is gone; the state is disposable anyway."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def _terminate(proc: _Process, grace_s: float = 10.0) -> None:
    if not proc.alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(WaitTimeout):
        wait_until(f"{proc.name} to exit", lambda: not proc.alive(), grace_s)
    if proc.alive():
        log.warning("Killed %s pid=%d reason=%s", proc.name, proc.pid, "no exit after SIGTERM")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    if proc.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)
    log.info("Stopped %s pid=%d", proc.name, proc.pid)


def _message(answer: Any) -> str:
    if isinstance(answer, dict):
        return str(answer.get("message", answer))
    return str(answer)[:500]
