"""A real Kubernetes control plane on this machine, for tests and the local playground.

`build` compiles etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, KWOK
and helm from the Go module proxy into a cache outside the repo; `runtime` runs them on
127.0.0.1 with fake A100 nodes. `LocalCluster` is the entry point for tests; the CLI is
`lorapool cluster {build,up,down,status}`. Importing this package is cheap: the runtime (and
`cryptography`) load on first use of `LocalCluster`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lorapool_dev.cluster.runtime import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from lorapool_dev.cluster import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
