"""Pinned versions of the control-plane binaries and where they are cached.

Pure data plus path helpers; imported by `build` (which compiles) and `runtime` (which runs).
Changing a version here makes the next `lorapool cluster build` compile into a new cache
directory; old directories are left alone so that switching back is free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lorapool.cache import cache_root

ETCD_VERSION = "v3.6.16"
# 1.36.3 is the newest patch of a minor whose go.mod says `go 1.26.0`, so the machine's
# Go 1.26 builds it without fetching a toolchain.
KUBERNETES_VERSION = "v1.36.3"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
# The real node (cluster/node.py): crictl to inspect its containerd, the CNI plugins its pods'
# network is made of. cri-tools tracks Kubernetes minors; 1.37's go.mod needs Go 1.26.6.
CRI_TOOLS_VERSION = "v1.37.0"
CNI_PLUGINS_VERSION = "v1.9.1"
# SIG Network's NetworkPolicy enforcer (kind's): nftables + nfqueue over netlink, run by the real
# node only when NetworkPolicy enforcement is wanted (cluster/netpol.py).
NETPOL_VERSION = "v0.8.0"
# The CNI plugins the node's network config names (bridge + host-local IPAM, loopback,
# portmap for hostPort); each is its own binary, installed side by side into one CNI bin dir.
CNI_PLUGINS = {
    "bridge": "main/bridge",
    "loopback": "main/loopback",
    "host-local": "ipam/host-local",
    "portmap": "meta/portmap",
}


@dataclass(frozen=True)
class Component:
    """One binary: how to build it and where it lands.

    `wrapper` components are built from a generated module that requires `module`; the others
    with `go install package@version`, which works only for modules whose go.mod has no
    replace directives.
    """

    name: str
    version: str
    module: str
    package: str
    ldflags: tuple[str, ...] = ()
    wrapper: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


def _kube_ldflags(version: str) -> tuple[str, ...]:
    """Version stamps that hack/lib/version.sh would set; without them the binaries say
    v0.0.0-master and the apiserver's emulation-version checks get confused."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


def _kube(name: str) -> Component:
    return Component(
        name=name,
        version=KUBERNETES_VERSION,
        module="k8s.io/kubernetes",
        package=f"k8s.io/kubernetes/cmd/{name}",
        ldflags=_kube_ldflags(KUBERNETES_VERSION),
        wrapper=True,
    )


COMPONENTS: tuple[Component, ...] = (
    Component(
        name="etcd",
        version=ETCD_VERSION,
        module="go.etcd.io/etcd/server/v3",
        package="go.etcd.io/etcd/server/v3",
        wrapper=True,
    ),
    _kube("kube-apiserver"),
    _kube("kube-controller-manager"),
    _kube("kube-scheduler"),
    _kube("kubectl"),
    _kube("kubelet"),
    _kube("kube-proxy"),
    Component(
        name="kwok",
        version=KWOK_VERSION,
        module="sigs.k8s.io/kwok",
        package="sigs.k8s.io/kwok/cmd/kwok",
        ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION.lstrip('v')}",),
    ),
    Component(
        name="helm",
        version=HELM_VERSION,
        module="helm.sh/helm/v3",
        package="helm.sh/helm/v3/cmd/helm",
        ldflags=(f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",),
    ),
    Component(
        name="crictl",
        version=CRI_TOOLS_VERSION,
        module="sigs.k8s.io/cri-tools",
        package="sigs.k8s.io/cri-tools/cmd/crictl",
        ldflags=(f"-X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION}",),
    ),
    *(
        Component(
            name=name,
            version=CNI_PLUGINS_VERSION,
            module="github.com/containernetworking/plugins",
            package=f"github.com/containernetworking/plugins/plugins/{path}",
        )
        for name, path in CNI_PLUGINS.items()
    ),
    # Its main package is `cmd`, which `go install` would name `cmd`: a wrapper build names it.
    Component(
        name="kube-network-policies",
        version=NETPOL_VERSION,
        module="sigs.k8s.io/kube-network-policies",
        package="sigs.k8s.io/kube-network-policies/cmd",
        wrapper=True,
    ),
)

BY_NAME: dict[str, Component] = {c.name: c for c in COMPONENTS}


def bin_dir(component: Component, root: Path | None = None) -> Path:
    return (root or cache_root()) / "bin" / component.key


def binary(name: str, root: Path | None = None) -> Path:
    """Path of a cached binary (it may not exist yet: `lorapool cluster build` makes it)."""
    component = BY_NAME[name]
    return bin_dir(component, root) / component.name
