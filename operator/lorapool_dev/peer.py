"""The Gateway API Inference Extension's endpoint picker (EPP) as the benchmark's peer: built, fed, run.

Issue 47: the one LoRA-aware router a platform team would pick instead of ours, measured behind the
same Envoy (``testing.envoy``, FULL_DUPLEX_STREAMED, TLS to the picker) on the same simulator
replicas. v1.5.0 is the last GIE release with ``cmd/epp`` (v1.6 keeps only a round-robin
``lwepp``); ``go install`` builds it from the module proxy into ``$LORAPOOL_CACHE/bin/epp-v1.5.0/``
exactly as ``cluster.build`` builds the control plane (same lock, same stamp, same rename).

The EPP finds its endpoints only through the API server: an InferencePool (v1) and Ready Pods with a
``status.podIP``. ``ControlPlane`` runs etcd and kube-apiserver alone (no scheduler, no kubelet:
nothing else writes the Pods); each simulator replica becomes one Pod whose status (127.0.0.1,
Ready) is written through the API and whose ``inference.networking.k8s.io/active-ports`` annotation
narrows the pool's targetPorts to that replica's own port (v1.5.0 ``datastore.go``: a
comma-separated list, ports not in targetPorts ignored, absent = every targetPort).

Pure: ``epp_config``, ``pool_manifest``, ``pod_manifest``, ``pod_status``, ``epp_args``. Shells:
``ensure_epp``, ``ControlPlane``, ``register_pool``, ``start_epp``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.versions import Component, bin_dir
from lorapool_dev.gotool import go_binary
from lorapool_dev.testing.processes import RunningProcess, free_port, start_process

EPP = Component(
    name="epp",
    version="v1.5.0",
    module="sigs.k8s.io/gateway-api-inference-extension",
    package="sigs.k8s.io/gateway-api-inference-extension/cmd/epp",
)
ACTIVE_PORTS = "inference.networking.k8s.io/active-ports"
POOL_GROUP = "inference.networking.k8s.io"
POOL_LABEL = {"app": "lorapool-bench-sim"}
MAX_TARGET_PORTS = 8  # InferencePool v1: targetPorts has at most 8 items
# v1.5.0 server/options.go: metrics refreshed every 50 ms, stale after 2 s (stretched by the time scale).
REFRESH_S = 0.05
STALENESS_S = 2.0
# v1.5.0 config/loader/defaults.go: the default profile's scorers and weights (no LoRA scorer).
DEFAULT_WEIGHTS = {"queue-scorer": 2.0, "kv-cache-utilization-scorer": 2.0, "prefix-cache-scorer": 3.0}
LORA_SCORER = "lora-affinity-scorer"


def epp_binary(root: Path | None = None) -> Path:
    return bin_dir(EPP, root) / EPP.name


def ensure_epp(root: Path | None = None) -> tuple[Path, float]:
    """The cached EPP binary, built first when missing (under the control plane's build lock):
    its path and the seconds a build took (0 when it was cached)."""
    root = root or cache_root()
    if build.is_built(EPP, root):
        return epp_binary(root), 0.0
    if go_binary() is None:
        raise RuntimeError("go is not on PATH nor in /usr/local/go/bin: install Go >= 1.26 to build the GIE EPP")
    with build.build_lock(root):
        seconds = 0.0 if build.is_built(EPP, root) else build.build_component(EPP, root)
    return epp_binary(root), seconds


def epp_config(lora_weight: float | None) -> str | None:
    """The EndpointPickerConfig text: None keeps the EPP's built-in default (queue 2, kv-cache 2,
    prefix 3); a weight adds ``lora-affinity-scorer`` at that weight to the same profile. Pure."""
    if lora_weight is None:
        return None
    if not lora_weight > 0:
        raise ValueError(f"lora_weight must be > 0 (got {lora_weight!r}); None runs the EPP's default config")
    weights = {**DEFAULT_WEIGHTS, LORA_SCORER: float(lora_weight)}
    config = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": name} for name in weights],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": n, "weight": w} for n, w in weights.items()]}
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def pool_manifest(name: str, ports: Sequence[int], picker_port: int) -> dict[str, Any]:
    """An InferencePool (v1) over every replica's port. Pure; at most 8 ports (the API's limit)."""
    if not 1 <= len(ports) <= MAX_TARGET_PORTS:
        raise ValueError(
            f"an InferencePool has 1 to {MAX_TARGET_PORTS} targetPorts; got {len(ports)} replicas: "
            "run the EPP on at most 8 replicas"
        )
    return {
        "apiVersion": f"{POOL_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": dict(POOL_LABEL)},
            "targetPorts": [{"number": p} for p in ports],
            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": picker_port}},
        },
    }


def pod_manifest(index: int, port: int) -> dict[str, Any]:
    """The Pod standing for replica ``index``: the pool's label, narrowed to its own port. Pure."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"sim-{index}",
            "namespace": "default",
            "labels": dict(POOL_LABEL),
            "annotations": {ACTIVE_PORTS: str(port)},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "sim", "image": "lorapool-sim", "ports": [{"containerPort": port}]}],
        },
    }


def pod_status(now: str) -> dict[str, Any]:
    """Running and Ready on 127.0.0.1: what a kubelet would write for a replica on this host. Pure."""
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now} for t in ("PodScheduled", "Initialized", "Ready")
    ]
    return {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "hostIP": "127.0.0.1",
        "conditions": conditions,
    }


def epp_args(pool: str, ports: dict[str, int], time_scale: float, config: str | None) -> list[str]:
    """The EPP's flags: our ports, no tracing/pprof/metrics auth (nothing here collects them), its
    metrics clocks stretched by the simulator's time scale as our router's are. Pure."""
    args = [
        "--pool-name", pool, "--pool-namespace", "default",
        "--grpc-port", str(ports["grpc"]), "--grpc-health-port", str(ports["health"]),
        "--metrics-port", str(ports["metrics"]),
        "--refresh-metrics-interval", f"{REFRESH_S * time_scale * 1000:.0f}ms",
        "--metrics-staleness-threshold", f"{STALENESS_S * time_scale * 1000:.0f}ms",
        "--tracing=false", "--enable-pprof=false", "--metrics-endpoint-auth=false", "--v", "0",
    ]  # fmt: skip
    return [*args, "--config-text", config] if config is not None else args


class ControlPlane:
    """etcd and kube-apiserver only, on fresh ports in a temporary state directory (what the EPP
    needs to discover endpoints); a context manager."""

    def __init__(self, state_dir: Path) -> None:
        from lorapool_dev.cluster.runtime import LocalCluster

        class _ApiOnly(LocalCluster):
            def _start(self, started: float) -> None:  # the first half of LocalCluster._start
                from lorapool_dev.cluster import state
                from lorapool_dev.cluster.health import api_ready, http_ok
                from lorapool_dev.cluster.manifests import Ports
                from lorapool_dev.testing.processes import free_ports

                state.make_dirs(self.layout)
                self.ports = ports = Ports(*free_ports(5))
                state.write_pki(self.layout, self.advertise_address)
                state.write_kubeconfigs(self.layout, self.server, self._kubeconfig)
                deadline = started + self.timeout_s
                self._spawn("etcd")
                self._wait("etcd healthy", deadline, lambda: http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"))
                self._spawn("kube-apiserver")
                api = self._api()
                self._wait("kube-apiserver ready", deadline, lambda: api_ready(api))

        self.cluster = _ApiOnly(state_dir, nodes=(), timeout_s=120.0)

    def __enter__(self) -> ControlPlane:
        self.cluster.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.cluster._api().request(method, path, body)

    def must(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
        status, answer = self.request(method, path, body)
        if status not in ok:
            raise RuntimeError(f"{method} {path} failed with HTTP {status}: {str(answer)[:400]}")
        return answer


def register_pool(plane: ControlPlane, pool: str, ports: Sequence[int], picker_port: int) -> None:
    """1. the InferencePool CRD, established, 2. the default ServiceAccount (no controller-manager
    makes it here, and Pod admission wants it), 3. one Pod per port with its status written,
    4. the InferencePool over them."""
    from lorapool.api.clock import rfc3339
    from lorapool_dev.testing.inferencepool_crd import NAME, inferencepool_crd

    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    plane.must("POST", crds, inferencepool_crd(), ok=(201, 409))
    deadline = time.monotonic() + 60
    while not _established(plane.must("GET", f"{crds}/{NAME}")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"CRD {NAME} not Established within 60 s")
        time.sleep(0.2)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
    plane.must("POST", "/api/v1/namespaces/default/serviceaccounts", account, ok=(201, 409))
    now = rfc3339(time.time())
    for i, port in enumerate(ports):
        pod = plane.must("POST", "/api/v1/namespaces/default/pods", pod_manifest(i, port))
        pod["status"] = pod_status(now)
        plane.must("PUT", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/status", pod)
    path = f"/apis/{POOL_GROUP}/v1/namespaces/default/inferencepools"
    plane.must("POST", path, pool_manifest(pool, ports, picker_port))


def _established(crd: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or []  # both absent until the API server answers
    )


@contextlib.contextmanager
def start_epp(
    backend_ports: Sequence[int], *, grpc_port: int, time_scale: float, lora_weight: float | None, state_dir: Path
) -> Iterator[RunningProcess]:
    """The control plane, the pool over ``backend_ports`` and the EPP serving ext_proc (TLS,
    self-signed) on ``grpc_port``; yields once its metrics endpoint answers (the pool may still
    be syncing: the caller waits for a request to go through)."""
    binary, _ = ensure_epp()
    ports = {"grpc": grpc_port, "health": free_port(), "metrics": free_port()}
    args = epp_args("bench", ports, time_scale, epp_config(lora_weight))
    with ControlPlane(state_dir) as plane:
        register_pool(plane, "bench", backend_ports, grpc_port)
        env = {"KUBECONFIG": str(plane.kubeconfig)}
        url = f"http://127.0.0.1:{ports['metrics']}/metrics"
        with start_process([str(binary), *args], url, timeout=60, env=env) as proc:
            yield proc


if __name__ == "__main__":  # python -m lorapool_dev.peer: build (once) and cache the GIE EPP, say where
    built, took = ensure_epp()
    print(built, f"{took:.0f} s")
