"""Pure builders for the local control plane: fake GPU nodes, kubeconfigs and command lines.

Called by `runtime`, which writes and runs what these return; nothing here touches the
filesystem, the network or a process, so the flags can be read (and tested) as plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
SERVICE_CIDR = "10.96.0.0/24"
POD_CIDR = "10.244.0.0/16"
# The first address of SERVICE_CIDR: the `kubernetes` Service's ClusterIP, so it is a SAN.
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"
LOOPBACK = "127.0.0.1"

# Controllers kube-controller-manager runs (names as in v1.36). Listed rather than "*" so the
# set is stable across versions and nothing that needs a cloud, a kubelet or a CSI driver
# (node-ipam, attach-detach, expander, DRA, selinux-warning) runs in a fake cluster. The
# protection controllers stay: without them a deleted PVC or PV keeps its finalizer forever.
CONTROLLERS: tuple[str, ...] = (
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "replicationcontroller-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "pod-garbage-collector-controller",
    "resourcequota-controller",
    "clusterrole-aggregation-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "horizontal-pod-autoscaler-controller",
    "certificatesigningrequest-signing-controller",
    "certificatesigningrequest-approving-controller",
    "certificatesigningrequest-cleaner-controller",
    "legacy-serviceaccount-token-cleaner-controller",
    "validatingadmissionpolicy-status-controller",
    "persistentvolume-binder-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    "ephemeral-volume-controller",
    "ttl-controller",
    "service-cidr-controller",
)


@dataclass(frozen=True)
class FakeNode:
    """A KWOK node. GPU nodes carry the labels NVIDIA's GPU feature discovery sets."""

    name: str
    cpu: str = "96"
    memory: str = "1Ti"
    pods: str = "110"
    gpu_product: str | None = None
    gpu_memory_mib: int = 0
    gpu_count: int = 0
    internal_ip: str = "10.240.0.1"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    taint_gpus: bool = False

    def manifest(self) -> dict[str, Any]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
        }
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods}
        taints: list[dict[str, str]] = []
        if self.gpu_product:
            labels |= {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": self.gpu_product,
                "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
                "nvidia.com/gpu.count": str(self.gpu_count),
                "nvidia.com/gpu.family": "ampere",
            }
            resources[GPU_RESOURCE] = str(self.gpu_count)
            if self.taint_gpus:
                taints.append({"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
        labels |= dict(self.extra_labels)
        spec: dict[str, Any] = {"taints": taints} if taints else {}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
            "status": {
                "allocatable": dict(resources),
                "capacity": dict(resources),
                "addresses": [
                    {"type": "InternalIP", "address": self.internal_ip},
                    {"type": "Hostname", "address": self.name},
                ],
            },
        }


A100_80GB = "NVIDIA-A100-SXM4-80GB"
A100_40GB = "NVIDIA-A100-SXM4-40GB"

DEFAULT_NODES: tuple[FakeNode, ...] = (
    FakeNode("gpu-a100-80gb-0", gpu_product=A100_80GB, gpu_memory_mib=81920, gpu_count=8, internal_ip="10.240.0.10"),
    FakeNode("gpu-a100-80gb-1", gpu_product=A100_80GB, gpu_memory_mib=81920, gpu_count=8, internal_ip="10.240.0.11"),
    FakeNode("gpu-a100-40gb-0", gpu_product=A100_40GB, gpu_memory_mib=40960, gpu_count=8, internal_ip="10.240.0.20"),
    FakeNode("cpu-0", cpu="32", memory="128Gi", internal_ip="10.240.0.30"),
)


def kubeconfig(
    server: str,
    ca_file: Path,
    user: str,
    *,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    token: str | None = None,
    namespace: str | None = None,
    cluster: str = "lorapool-local",
) -> dict[str, Any]:
    """A one-context kubeconfig; credentials are a client cert pair or a bearer token."""
    creds: dict[str, str] = {}
    if cert_file and key_file:
        creds = {"client-certificate": str(cert_file), "client-key": str(key_file)}
    if token:
        creds = {"token": token}
    context: dict[str, str] = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": f"{user}@{cluster}", "context": context}],
        "current-context": f"{user}@{cluster}",
    }


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class Layout:
    """Where a cluster keeps its files, relative to one state directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfigs(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    def cert(self, name: str) -> Path:
        return self.pki / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.pki / f"{name}.key"

    def component_kubeconfig(self, name: str) -> Path:
        return self.kubeconfigs / f"{name}.yaml"


def etcd_args(layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        "--name=lorapool",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=lorapool={peer}",
        "--initial-cluster-state=new",
        # Data is disposable; skipping fsync makes every API write ~10x cheaper on slow disks.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_args(layout: Layout, ports: Ports, advertise_address: str = LOOPBACK) -> list[str]:
    """Loopback only, unless a real node's pods must reach it at `advertise_address` (the
    `kubernetes` Service's endpoint): then it listens on every address of its own namespace."""
    issuer = f"https://127.0.0.1:{ports.apiserver}"
    return [
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--bind-address={LOOPBACK if advertise_address == LOOPBACK else '0.0.0.0'}",
        f"--advertise-address={advertise_address}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={layout.pki}",
        f"--tls-cert-file={layout.cert('apiserver')}",
        f"--tls-private-key-file={layout.key('apiserver')}",
        f"--client-ca-file={layout.cert('ca')}",
        "--authorization-mode=Node,RBAC",
        # The front-proxy CA lets aggregated API servers (metrics-server, ...) trust the
        # apiserver, and keeps the other components from logging a missing requestheader CA.
        f"--requestheader-client-ca-file={layout.cert('front-proxy-ca')}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={layout.cert('front-proxy-client')}",
        f"--proxy-client-key-file={layout.key('front-proxy-client')}",
        f"--service-account-issuer={issuer}",
        f"--service-account-key-file={layout.pki / 'sa.pub'}",
        f"--service-account-signing-key-file={layout.key('sa')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--kubelet-client-certificate={layout.cert('apiserver-kubelet-client')}",
        f"--kubelet-client-key={layout.key('apiserver-kubelet-client')}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_args(layout: Layout, ports: Ports) -> list[str]:
    config = layout.component_kubeconfig("kube-controller-manager")
    return [
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        f"--cert-dir={layout.pki / 'kube-controller-manager'}",
        f"--service-account-private-key-file={layout.key('sa')}",
        f"--root-ca-file={layout.cert('ca')}",
        f"--cluster-signing-cert-file={layout.cert('ca')}",
        f"--cluster-signing-key-file={layout.key('ca')}",
        # Each controller acts as its own ServiceAccount, as on a real cluster, so RBAC
        # mistakes in bootstrap roles would show up here too.
        "--use-service-account-credentials=true",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def scheduler_args(layout: Layout, ports: Ports) -> list[str]:
    config = layout.component_kubeconfig("kube-scheduler")
    return [
        f"--kubeconfig={config}",
        f"--authentication-kubeconfig={config}",
        f"--authorization-kubeconfig={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={layout.pki / 'kube-scheduler'}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def kwok_args(layout: Layout, stages: Path) -> list[str]:
    return [
        f"--kubeconfig={layout.component_kubeconfig('kwok')}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}",
        "--node-ip=10.240.0.1",
        "--node-lease-duration-seconds=40",
    ]
