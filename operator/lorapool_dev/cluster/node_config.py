"""Pure builders for the real node: its names, the configs of containerd, the kubelet,
kube-proxy and CNI, the pause image archive, and the Node's GPU labels.

Called by `lorapool_dev.cluster.node`, which writes and runs what these return; nothing here
touches the filesystem, the network or a process.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapool_dev.cluster.manifests import A100_80GB, CLUSTER_DOMAIN, GPU_RESOURCE, FakeNode

NODE_NAME = "real-a100-0"
# Inside the run's own network namespace only: no interface of this machine holds these.
NODE_IP = "10.250.0.1"
POD_SUBNET = "10.250.16.0/24"
PAUSE_IMAGE = "lorapool.local/pause:1"
# The label that says which node is which; KWOK nodes get this taint with `--node real`.
FAKE_NODE_TAINT = {"key": "lorapool.io/fake-node", "value": "kwok", "effect": "NoSchedule"}
# VM-wide sysctls the kubelet (and kube-proxy's conntrack setup) may rewrite; snapshotted
# before the node starts and written back after it stops. Paths under /proc/sys.
HOST_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/netfilter/nf_conntrack_max",
)
# Paths outside the run dir that the kubelet hardcodes (its device-plugin socket, the
# /var/log/containers symlinks) and `ip netns` makes. Teardown removes what the run put there,
# and each directory it created, only while empty (rmdir, never a recursive delete).
HOST_PATHS = (
    Path("/var/lib/kubelet/device-plugins"),
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/run/netns"),
)
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
# Where teardown looks for the real node's cgroups (cgroup v1 hierarchies).
CGROUP_FS = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class RunNames:
    """Every per-run name, from one random id: two runs never share a namespace, a bridge,
    a cgroup or a CNI network."""

    run_id: str

    @property
    def netns(self) -> str:
        return f"lp-{self.run_id}"

    @property
    def bridge(self) -> str:
        return f"lpbr{self.run_id}"  # 12 characters: Linux allows 15

    @property
    def cgroup_root(self) -> str:
        return f"/lorapool-{self.run_id}"

    @property
    def cni_network(self) -> str:
        return f"lorapool-{self.run_id}"


@dataclass(frozen=True)
class NodeLayout:
    """Where the real node keeps its files, under one run directory."""

    root: Path

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def socket(self) -> Path:
        return self.containerd / "containerd.sock"

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def cni_bin(self) -> Path:
        return self.root / "cni" / "bin"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pki(self) -> Path:
        return self.root / "pki"


def containerd_config(layout: NodeLayout) -> str:
    """containerd 1.6 with its CRI plugin on. `restrict_oom_score_adj`: this process lacks
    CAP_SYS_RESOURCE, and without it every sandbox fails with "can't get final child's PID
    from pipe"; cgroupfs (no systemd) as the kubelet's `cgroupDriver`; CNI from the run dir."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{layout.containerd}/root"
state = "{layout.containerd}/state"
[grpc]
  address = "{layout.socket}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  netns_mounts_under_state_dir = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{layout.cni_bin}"
  conf_dir = "{layout.cni_conf}"
  max_conf_num = 1
"""


def cni_config(names: RunNames, layout: NodeLayout) -> dict[str, Any]:
    """A bridge with host-local IPAM (its state under the run dir) and portmap for hostPort."""
    return {
        "cniVersion": "1.0.0",
        "name": names.cni_network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": names.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.root / "cni" / "ipam"),
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(names: RunNames, layout: NodeLayout, ca_file: Path) -> dict[str, Any]:
    """KubeletConfiguration for this machine: cgroup v1 (`failCgroupV1: false`) through
    cgroupfs under a per-run cgroup root; every path under the run dir; image GC and disk
    eviction off (the images are imported, none can be pulled back); client-cert auth only."""
    kubelet = layout.kubelet
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": names.cgroup_root,
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": f"unix://{layout.socket}",
        "address": NODE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(layout.pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(layout.pki / "kubelet.key"),
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(layout.root / "resolv.conf"),
        "podLogsDir": str(kubelet / "pod-logs"),
        "volumePluginDir": str(kubelet / "volume-plugins"),
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "nodeStatusReportFrequency": "10s",
        "maxPods": 110,
    }


def kubelet_args(layout: NodeLayout, kubeconfig: Path) -> list[str]:
    return [
        f"--config={layout.root / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={layout.kubelet}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    ]


def kube_proxy_config(kubeconfig: Path) -> dict[str, Any]:
    """iptables mode (the kernel has no IPVS). masqueradeAll: a pod reaching a Service whose
    endpoint sits on the same bridge gets its reply back through the namespace's conntrack
    without br_netfilter. conntrack zeros: leave the VM-wide conntrack sysctls alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def node_labels() -> dict[str, str]:
    """The labels NVIDIA's GPU feature discovery puts on an 8 x A100-80GB node (as on the
    KWOK nodes), plus the marker that says this one is real."""
    fake = FakeNode(NODE_NAME, gpu_product=A100_80GB, gpu_memory_mib=81920, gpu_count=8).manifest()
    labels: dict[str, str] = {k: v for k, v in fake["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
    return labels | {"lorapool.io/node": "real"}


def gpu_status_patch(count: int = 8) -> dict[str, Any]:
    """`nvidia.com/gpu` as a status patch (no device plugin: nothing here has a GPU to hand
    out); the kubelet keeps extended resources it does not manage, and derives allocatable."""
    return {"status": {"capacity": {GPU_RESOURCE: str(count)}, "allocatable": {GPU_RESOURCE: str(count)}}}


def pause_archive(binary: bytes) -> bytes:
    """A docker-archive (what `ctr images import` reads) of a one-file image: /pause."""
    layer = _tar({"pause": (binary, 0o755)})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    manifest = [{"Config": "config.json", "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]}]
    return _tar(
        {
            "layer.tar": (layer, 0o644),
            "config.json": (json.dumps(config).encode(), 0o644),
            "manifest.json": (json.dumps(manifest).encode(), 0o644),
        }
    )


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


PAUSE_GO = """// The sandbox process of the real node's pods: hold the namespaces, reap children, exit on TERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
"""
