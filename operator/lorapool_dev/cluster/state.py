"""What a local cluster keeps on disk, in one state directory: certificates, kubeconfigs, the
KWOK stages, and `cluster.json` (server, ports, the pid of every component).

Called by `runtime.LocalCluster`: written as it starts (`cluster.json` again after every
process it starts, so `down` finds the pid even if the starter dies), read back by `attach`,
`status` and `down`, removed by `stop`. Shell: file I/O only; the certificates come from `pki`,
the kubeconfigs from `manifests`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lorapool.cache import cache_root
from lorapool_dev.cluster import manifests, pki
from lorapool_dev.cluster.manifests import LOOPBACK, Layout, Ports
from lorapool_dev.cluster.processes import Process

# Everything `down` may delete inside a state directory: never more, so a mistyped --dir
# (say, $HOME) loses nothing that the cluster did not create.
OWNED = ("pki", "logs", "etcd", "kubeconfig", "stages.yaml", "cluster.json")
# Users with a client certificate and a kubeconfig of their own.
KUBECONFIG_USERS = ("admin", "kube-controller-manager", "kube-scheduler", "kwok")


def default_state_dir() -> Path:
    """Where `lorapool cluster up` keeps its state unless told (`--dir`)."""
    return cache_root() / "cluster"


def write_file(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` (parents made), created with ``mode`` (keys and tokens: 0o600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(raw)


def is_ours(kubeconfig: Path) -> bool:
    """A kubeconfig this package wrote (its only cluster is lorapool-local)."""
    try:
        config = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError):
        return False
    clusters = config.get("clusters") if isinstance(config, dict) else None
    return isinstance(clusters, list) and [c.get("name") for c in clusters] == ["lorapool-local"]


def make_dirs(layout: Layout) -> None:
    """The state directory's folders; the private keys' one readable by its owner only."""
    for directory in (layout.pki, layout.logs, layout.kubeconfigs):
        directory.mkdir(parents=True, exist_ok=True)
    layout.pki.chmod(0o700)


def write_pki(layout: Layout, advertise_address: str) -> None:
    """A fresh CA, every component's certificate, the ServiceAccount signing key and the
    front-proxy pair; the apiserver's certificate also names ``advertise_address``."""
    ca = pki.new_ca()
    front_proxy_ca = pki.new_ca("lorapool-front-proxy-ca")
    pairs = {
        "ca": ca,
        "apiserver": pki.issue(
            ca,
            "kube-apiserver",
            server_names=(
                "127.0.0.1",
                *([advertise_address] if advertise_address != LOOPBACK else []),
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
        write_file(layout.key(name), pair.key_pem, 0o600)
        if name == "sa":
            write_file(layout.pki / "sa.pub", pair.cert_pem)
        else:
            write_file(layout.cert(name), pair.cert_pem)


def write_kubeconfigs(layout: Layout, server: str, admin: Path) -> None:
    """A client-certificate kubeconfig per user in the state directory, the admin's also at ``admin``."""
    for user in KUBECONFIG_USERS:
        config = manifests.kubeconfig(
            server, layout.cert("ca"), user, cert_file=layout.cert(user), key_file=layout.key(user)
        )
        text = yaml.safe_dump(config, sort_keys=False)
        write_file(layout.component_kubeconfig(user), text, 0o600)
        if user == "admin" and admin != layout.component_kubeconfig(user):
            write_file(admin, text, 0o600)


def write_stages(layout: Layout) -> None:
    """KWOK's stages (node and pod lifecycles), copied from the package to `stages.yaml`."""
    text = resources.files("lorapool_dev.cluster").joinpath("stages.yaml").read_text()
    write_file(layout.root / "stages.yaml", text)


def save(layout: Layout, server: str, kubeconfig: Path, ports: Ports, procs: Mapping[str, Process]) -> None:
    """Write `cluster.json`: where the API is, the admin kubeconfig, the ports, every process."""
    state = {
        "server": server,
        "kubeconfig": str(kubeconfig),
        "ports": vars(ports),
        "processes": {n: p.to_state() for n, p in procs.items()},
    }
    write_file(layout.state_file, json.dumps(state, indent=2) + "\n")


def load(layout: Layout) -> dict[str, Any] | None:
    """`cluster.json` as written by ``save``; None when there is none (or it is unreadable)."""
    try:
        state: dict[str, Any] = json.loads(layout.state_file.read_text())
    except (OSError, ValueError):
        return None
    return state


def remove(layout: Layout) -> None:
    """Delete what the cluster created (``OWNED``), then the directory itself if nothing else is left."""
    for name in OWNED:
        path = layout.root / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        layout.root.rmdir()  # only if nothing else lives there
