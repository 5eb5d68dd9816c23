"""Run the local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and KWOK as background processes on 127.0.0.1, with fake A100 nodes.

The shell behind `lorapool cluster up/down/status` and the `LocalCluster` API that tests use.
`LocalCluster` is the cluster object: it starts the components in order and waits for each,
creates the fake nodes, restarts and stops components, mints ServiceAccount kubeconfigs and
reports status. The rest lives beside it: `processes` (starting, watching and stopping one
component), `health` (the apiserver's HTTPS seam, health probes, waiting while components
live) and `state` (the state directory: certificates, kubeconfigs, `cluster.json` with pids
and ports). The operator's own client library is not needed to bring a cluster up.

`ClusterError` (from `errors`) stays importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from lorapool.cache import cache_root
from lorapool_dev.cluster import build, manifests, state
from lorapool_dev.cluster.errors import ClusterError
from lorapool_dev.cluster.health import (
    Api,
    api_ready,
    component_health,
    http_ok,
    https_ok,
    message,
    nodes_ready,
    wait_while_alive,
)
from lorapool_dev.cluster.manifests import DEFAULT_NODES, LOOPBACK, FakeNode, Layout, Ports
from lorapool_dev.cluster.netns import Netns, Relay
from lorapool_dev.cluster.processes import Process, child_setup, spawn, terminate
from lorapool_dev.cluster.state import default_state_dir, is_ours
from lorapool_dev.cluster.versions import binary
from lorapool_dev.testing.processes import free_ports

__all__ = ["COMPONENTS", "PORT_ATTEMPTS", "ClusterError", "LocalCluster", "default_state_dir"]

log = logging.getLogger("lorapool_dev.cluster")

# Start order; stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Starts to try when a component finds its port taken (see LocalCluster.start).
PORT_ATTEMPTS = 3


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
        self._procs: dict[str, Process] = {}
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
        """1. refuse what would go wrong (binaries missing, a cluster running here, a foreign
        kubeconfig in the way), 2. start every component and the nodes, retrying a port another
        process took meanwhile, 3. with a namespace, relay the API to this one."""
        self._check_can_start()
        state.remove(self.layout)
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
                terminate(proc)
        if self._external_kubeconfig() and is_ours(self._kubeconfig):
            self._kubeconfig.unlink(missing_ok=True)
        state.remove(self.layout)
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
                terminate(proc)
        deadline = time.monotonic() + self.timeout_s
        for name in COMPONENTS:
            if name in names:
                self._spawn(name)
        api = self._api()
        self._wait("kube-apiserver ready after a restart", deadline, lambda: api_ready(api))

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
                f"TokenRequest for ServiceAccount {namespace}/{name} failed with HTTP {status}: {message(answer)}"
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
        state.write_file(target, yaml.safe_dump(config, sort_keys=False), 0o600)
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
        saved = self._load_state()
        if saved is None:
            return {"running": False, "state_dir": str(self.layout.root)}
        assert self.ports is not None
        health = component_health(self.ports, self.server)
        procs = {
            name: {"pid": p.pid, "alive": p.alive(), "healthy": health.get(name, p.alive()), "log": str(p.log)}
            for name, p in self._procs.items()
        }
        return {
            "running": all(p["alive"] for p in procs.values()),
            "server": self.server,
            "kubeconfig": saved["kubeconfig"],
            "state_dir": str(self.layout.root),
            "processes": procs,
        }

    @classmethod
    def attach(cls, state_dir: Path | None = None) -> LocalCluster:
        """The cluster a previous `up` left running in `state_dir` (for down and status)."""
        cluster = cls(state_dir)
        saved = cluster._load_state()
        if saved is not None:
            cluster._kubeconfig = Path(saved["kubeconfig"])
        return cluster

    # -- starting --------------------------------------------------------------------------

    def _check_can_start(self) -> None:
        """Raise ClusterError, with the fix, when starting here would fail or destroy something."""
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
        if self._external_kubeconfig() and self._kubeconfig.exists() and not is_ours(self._kubeconfig):
            raise ClusterError(
                f"{self._kubeconfig} exists and is not a lorapool kubeconfig; pass another --kubeconfig "
                "path (this one would be overwritten, then deleted by `down`)"
            )

    def _start(self, started: float) -> None:
        """One attempt: 1. the state directory on fresh ports, 2. etcd, then the apiserver, each
        waited for, 3. the other components, 4. the fake nodes, 5. wait for the cluster to settle."""
        layout = self.layout
        state.make_dirs(layout)
        self.ports = ports = Ports(*free_ports(5))
        state.write_pki(layout, self.advertise_address)
        state.write_kubeconfigs(layout, self.server, self._kubeconfig)
        state.write_stages(layout)

        deadline = started + self.timeout_s
        self._spawn("etcd")
        self._wait("etcd healthy", deadline, lambda: http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"))
        self._spawn("kube-apiserver")
        api = self._api()
        self._wait("kube-apiserver ready", deadline, lambda: api_ready(api))
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._spawn(name)
        self._create_nodes(api)
        self._wait_settled(api, deadline)

    def _create_nodes(self, api: Api) -> None:
        """POST every fake node (one left from an earlier attempt is fine)."""
        for node in self.nodes:
            status, answer = api.request("POST", "/api/v1/nodes", node.manifest())
            if status not in (201, 409):
                raise ClusterError(f"creating Node {node.name} failed with HTTP {status}: {message(answer)}")
            log.info("Created Node name=%s gpuProduct=%s", node.name, node.gpu_product or "-")

    def _wait_settled(self, api: Api, deadline: float) -> None:
        """Wait for the fake nodes Ready, the default ServiceAccount, then the scheduler and the
        controller-manager healthy."""
        assert self.ports is not None
        ports, names = self.ports, {n.name for n in self.nodes}
        self._wait("fake nodes Ready", deadline, lambda: nodes_ready(api, names))
        self._wait(
            "default ServiceAccount",
            deadline,
            lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        )
        self._wait("kube-scheduler healthy", deadline, lambda: https_ok(f"https://127.0.0.1:{ports.scheduler}/healthz"))
        self._wait(
            "kube-controller-manager healthy",
            deadline,
            lambda: https_ok(f"https://127.0.0.1:{ports.controller_manager}/healthz"),
        )

    def _external_kubeconfig(self) -> bool:
        return not self._kubeconfig.resolve().is_relative_to(self.layout.root)

    def _args(self, name: str) -> list[str]:
        """The flags component ``name`` runs with: the same on a restart (ports, certificates, data)."""
        assert self.ports is not None
        layout, ports = self.layout, self.ports
        args: dict[str, Callable[[], list[str]]] = {
            "etcd": lambda: manifests.etcd_args(layout, ports),
            "kube-apiserver": lambda: manifests.apiserver_args(layout, ports, self.advertise_address),
            "kube-controller-manager": lambda: manifests.controller_manager_args(layout, ports),
            "kube-scheduler": lambda: manifests.scheduler_args(layout, ports),
            "kwok": lambda: manifests.kwok_args(layout, layout.root / "stages.yaml"),
        }
        return args[name]()

    def _spawn(self, name: str) -> None:
        """Start component ``name`` and record its pid in `cluster.json` at once."""
        self._procs[name] = spawn(
            name,
            self._args(name),
            self.layout.root,
            self.layout.logs / f"{name}.log",
            child_setup(self.netns, self.detach),
        )
        self._save_state()  # at once: if this process dies now, `down` still finds the pid

    def _wait(self, what: str, deadline: float, done: Callable[[], bool]) -> None:
        wait_while_alive(what, deadline, done, self._procs, self.timeout_s)

    def _api(self) -> Api:
        return Api(self.server, self.layout.cert("ca"), self.layout.cert("admin"), self.layout.key("admin"))

    # -- state -----------------------------------------------------------------------------

    def _save_state(self) -> None:
        assert self.ports is not None
        state.save(self.layout, self.server, self._kubeconfig, self.ports, self._procs)

    def _load_state(self) -> dict[str, Any] | None:
        """`cluster.json`, adopting its ports and the processes not already known; None when absent."""
        saved = state.load(self.layout)
        if saved is None:
            return None
        self.ports = Ports(**saved["ports"])
        for name, entry in saved["processes"].items():
            if name not in self._procs:
                self._procs[name] = Process.from_state(name, entry)
        return saved

    def _running_state(self) -> dict[str, Any] | None:
        probe = LocalCluster(self.layout.root)
        saved = probe._load_state()
        if saved is not None and any(p.alive() for p in probe._procs.values()):
            return saved
        return None
