"""NetworkPolicy enforcement on the real node: SIG Network's kube-network-policies (kind's enforcer)
run as a host process inside the node's network namespace, as kube-proxy is.

Called by `RealNode.enforce_network_policy` (cluster/node.py), only where enforcement is wanted
(the e2e tier, the NetworkPolicy tests). What v0.8.0 needs, read from its source:
- credentials: only `rest.InClusterConfig()` (no --kubeconfig flag), i.e. a bearer token and a CA
  at /var/run/secrets/kubernetes.io/serviceaccount and KUBERNETES_SERVICE_HOST/PORT. So it gets a
  ServiceAccount token (TokenRequest) with a ClusterRole to read pods, namespaces, nodes and
  networkpolicies, and runs in a private mount namespace whose /run is a tmpfs holding that
  directory (a bind mount of the run's own): nothing on this machine's /var/run changes.
- the kernel: nf_tables and nfnetlink_queue over netlink (no `nft` binary). It owns one table,
  `inet kube-network-policies`, whose postrouting chain sends a new connection's first packet to
  or from a pod some policy selects to queue 100; its verdict is the policy's. Pod-to-pod traffic
  on the node's bridge reaches that hook only with br_netfilter's bridge-nf-call-iptables on in
  the node's namespace (per namespace since Linux 5.3; on by default). A kernel without nft's
  `queue` expression (this VM's: CONFIG_NFT_QUEUE unset) refuses its whole rules batch; it still
  listens on the queue, so the same diversion is made here with iptables' NFQUEUE instead.
- it lets through everything root's sockets on the node send (kubelet probes), and removes its
  table on SIGINT (not SIGTERM). Its NRI plugin finds no socket here (containerd 1.6): it then
  learns pod IPs from the API server only, and a SYN it drops for a pod it does not know yet is
  retransmitted and judged again.

The netlink helpers list and delete nftables tables without the `nft` tool: health (the table
is there and queue 100 is bound) and teardown (the table is gone, whatever the process did).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import socket
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from lorapool_dev.cluster import build
from lorapool_dev.cluster.errors import ClusterError
from lorapool_dev.cluster.netns import Netns

NAME = "kube-network-policies"
TABLE = "kube-network-policies"  # the enforcer's default NFTableName
QUEUE_ID = 100
METRICS_ADDRESS = "127.0.0.1:9080"  # inside the node's namespace only
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = NAME
TOKEN_DURATION = "24h"  # longer than any test session or playground run it serves
SECRETS_MOUNT = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is a symlink to /run
STOP_TIMEOUT_S = 20.0  # it sleeps 5 s after SIGINT before it exits (its "grace period")
# The iptables chain that sends pod connections to the enforcer's queue where nft cannot (below).
CHAIN = "LORAPOOL-NETPOL"

# netlink (linux/netlink.h, linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h)
NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_NEWTABLE, NFT_MSG_GETTABLE, NFT_MSG_DELTABLE = 0, 1, 2
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFPROTO_INET = 1
NFTA_TABLE_NAME = 1
NLA_TYPE_MASK = 0x3FFF


class NetpolError(ClusterError):
    """The enforcer could not be prepared, or its nftables state could not be read or removed."""


# -- pure: what the enforcer is given -----------------------------------------------------------


def rbac_manifests() -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole and binding: what v0.8.0's informers list and watch (nodes only
    for AdminNetworkPolicy, which stays off, but kind's manifest grants it too)."""
    read = ["get", "list", "watch"]
    role: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME},
    }
    role["rules"] = [
        {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes"], "verbs": read},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": read},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        role,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        },
    ]


# Runs as root in a fresh mount namespace (unshare): /run becomes a private tmpfs holding only the
# ServiceAccount directory, bind-mounted read-only from the run dir. Positional: $1 the secrets dir.
MOUNT_SCRIPT = f"""set -eu
mount -t tmpfs -o size=1m,mode=0755 lorapool-netpol /run
mkdir -p {SECRETS_MOUNT}
mount --bind "$1" {SECRETS_MOUNT}
mount -o remount,bind,ro {SECRETS_MOUNT}
shift
exec "$@"
"""


def enforcer_argv(binary: Path, secrets_dir: Path, server: str, node_name: str) -> list[str]:
    """The command line: env (in-cluster address), unshare (mount namespace), sh (mounts), binary.

    `server` is the API server's URL as the node's namespace sees it (https://127.0.0.1:PORT)."""
    url = urlsplit(server)
    if url.scheme != "https" or not url.hostname or not url.port:
        raise NetpolError(f"API server URL {server!r} has no https host and port for KUBERNETES_SERVICE_HOST/PORT")
    return [
        "env",
        f"KUBERNETES_SERVICE_HOST={url.hostname}",
        f"KUBERNETES_SERVICE_PORT={url.port}",
        "unshare",
        "--mount",
        "--propagation=private",
        "sh",
        "-c",
        MOUNT_SCRIPT,
        "sh",
        str(secrets_dir),
        str(binary),
        f"--hostname-override={node_name}",
        f"--nfqueue-id={QUEUE_ID}",
        f"--metrics-bind-address={METRICS_ADDRESS}",
        "--v=2",
    ]


def bound_queues(proc_nfnetlink_queue: str) -> set[int]:
    """Queue numbers bound to a listener, from /proc/net/netfilter/nfnetlink_queue (first column)."""
    return {int(line.split()[0]) for line in proc_nfnetlink_queue.splitlines() if line.split()}


def nft_queue_in_config(config: str | None) -> bool:
    """Whether a kernel config (/proc/config.gz's text; None when the kernel does not publish it)
    has nft's `queue` expression. Without it every batch naming one fails with ENOENT."""
    if config is None:
        return True
    return any(line in ("CONFIG_NFT_QUEUE=y", "CONFIG_NFT_QUEUE=m") for line in config.splitlines())


def diversion_rules(pod_subnet: str) -> list[list[str]]:
    """iptables (mangle POSTROUTING, before kube-proxy's masquerade) doing what the enforcer's own
    nft chain does, for kernels without nft `queue` but with xtables' NFQUEUE (this VM's): root's
    sockets on the node, and established or related packets, pass; a new connection's first
    packet to or from a pod goes to the queue, where the enforcer judges it (no listener: dropped,
    as with its own chain). Every pod, not only policy-selected ones: it accepts the others."""
    queue = ["-j", "NFQUEUE", "--queue-num", str(QUEUE_ID)]
    return [
        ["-N", CHAIN],
        ["-A", CHAIN, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
        ["-A", CHAIN, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        ["-A", CHAIN, "-s", pod_subnet, *queue],
        ["-A", CHAIN, "-d", pod_subnet, *queue],
        ["-A", "POSTROUTING", "-j", CHAIN],
    ]


REMOVE_DIVERSION = (["-D", "POSTROUTING", "-j", CHAIN], ["-F", CHAIN], ["-X", CHAIN])


# -- pure: netlink messages -----------------------------------------------------------------------


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _message(msg_type: int, flags: int, seq: int, family: int, body: bytes = b"", res_id: int = 0) -> bytes:
    """nlmsghdr + nfgenmsg (family, version 0, res_id big-endian) + attributes."""
    payload = struct.pack("=BB", family, 0) + struct.pack("!H", res_id) + body
    return struct.pack("=IHHII", 16 + len(payload), msg_type, flags, seq, 0) + payload


def list_tables_request(seq: int) -> bytes:
    return _message((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, NLM_F_REQUEST | NLM_F_DUMP, seq, NFPROTO_INET)


def delete_table_request(name: str, seq: int) -> bytes:
    """One nftables batch (begin, delete, end): only the delete asks for an acknowledgement."""
    begin = _message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, res_id=NFNL_SUBSYS_NFTABLES)
    delete = _message(
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELTABLE,
        NLM_F_REQUEST | NLM_F_ACK,
        seq + 1,
        NFPROTO_INET,
        _attr(NFTA_TABLE_NAME, name.encode() + b"\0"),
    )
    end = _message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq + 2, 0, res_id=NFNL_SUBSYS_NFTABLES)
    return begin + delete + end


def parse_messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, seq, payload) of each netlink message in one datagram."""
    offset = 0
    while offset + 16 <= len(data):
        length, msg_type, _flags, seq, _pid = struct.unpack_from("=IHHII", data, offset)
        if length < 16:
            raise NetpolError(f"malformed netlink message length={length}")
        yield msg_type, seq, data[offset + 16 : offset + length]
        offset += (length + 3) & ~3


def table_name(payload: bytes) -> str | None:
    """NFTA_TABLE_NAME of a NEWTABLE message's payload (after its 4-byte nfgenmsg)."""
    offset = 4
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            return None
        if kind & NLA_TYPE_MASK == NFTA_TABLE_NAME:
            return payload[offset + 4 : offset + length].rstrip(b"\0").decode()
        offset += (length + 3) & ~3
    return None


def error_code(payload: bytes) -> int:
    """The (negative) errno of an NLMSG_ERROR; 0 is an acknowledgement."""
    (code,) = struct.unpack_from("=i", payload, 0)
    return int(code)


# -- shell: netlink in the node's namespace -------------------------------------------------------


def _socket(netns: Netns) -> socket.socket:
    """A netfilter netlink socket of the node's namespace (a socket keeps the namespace it was
    opened in, so only its creation needs the thread inside)."""
    with netns.entered():
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.settimeout(5)
    sock.bind((0, 0))
    return sock


def inet_tables(netns: Netns) -> set[str]:
    """Names of the inet-family nftables tables in the node's namespace."""
    names: set[str] = set()
    with _socket(netns) as sock:
        sock.send(list_tables_request(1))
        while True:
            for msg_type, _seq, payload in parse_messages(sock.recv(1 << 16)):
                if msg_type == NLMSG_DONE:
                    return names
                if msg_type == NLMSG_ERROR:
                    raise NetpolError(f"listing nftables tables failed: {os.strerror(-error_code(payload))}")
                if msg_type == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE and (name := table_name(payload)):
                    names.add(name)


def delete_table(netns: Netns, name: str) -> bool:
    """Delete `inet <name>` in the node's namespace; False when it was not there."""
    with _socket(netns) as sock:
        sock.send(delete_table_request(name, 1))
        while True:
            for msg_type, seq, payload in parse_messages(sock.recv(1 << 16)):
                if msg_type != NLMSG_ERROR:
                    continue
                code = error_code(payload)
                if code == 0 and seq == 2:
                    return True
                if code == -2:  # ENOENT
                    return False
                if code != 0:
                    raise NetpolError(f"deleting nftables table inet {name} failed: {os.strerror(-code)}")


def _read_in(netns: Netns, path: str) -> str:
    """A /proc/sys/net or /proc/net file as the node's namespace sees it (they show the reader's)."""
    result = subprocess.run(
        ["nsenter", f"--net={netns.path}", "cat", path], capture_output=True, text=True, timeout=10, check=False
    )
    return result.stdout if result.returncode == 0 else ""


def queues_bound(netns: Netns) -> set[int]:
    """nfqueue numbers with a listener in the node's namespace."""
    return bound_queues(_read_in(netns, "/proc/net/netfilter/nfnetlink_queue"))


def bridge_calls_netfilter(netns: Netns) -> bool:
    """Whether bridged IPv4 traffic in the node's namespace passes the inet hooks (br_netfilter)."""
    return _read_in(netns, "/proc/sys/net/bridge/bridge-nf-call-iptables").strip() == "1"


def nft_queue_supported() -> bool:
    try:
        config = gzip.decompress(Path("/proc/config.gz").read_bytes()).decode(errors="replace")
    except OSError:
        config = None
    return nft_queue_in_config(config)


def _iptables(netns: Netns, args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = ["nsenter", f"--net={netns.path}", "iptables", "-w", "5", "-t", "mangle", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


def diverted(netns: Netns) -> bool:
    return _iptables(netns, ["-C", "POSTROUTING", "-j", CHAIN]).returncode == 0


def install_diversion(netns: Netns, pod_subnet: str) -> None:
    remove_diversion(netns)
    for args in diversion_rules(pod_subnet):
        result = _iptables(netns, args)
        if result.returncode != 0:
            raise NetpolError(f"iptables -t mangle {' '.join(args)} failed in {netns.name}: {result.stderr.strip()}")


def remove_diversion(netns: Netns) -> None:
    if netns.exists():
        for args in REMOVE_DIVERSION:
            _iptables(netns, list(args))  # absent already: nothing to do


def enforcing(netns: Netns) -> bool:
    """Health: its queue has a listener (bound after its informers synced and the rules were
    written) and its table (or, without nft `queue`, the diversion) is in the namespace."""
    if QUEUE_ID not in queues_bound(netns):
        return False
    return TABLE in inet_tables(netns) if nft_queue_supported() else diverted(netns)


def write_secrets(directory: Path, token: str, ca_pem: bytes) -> None:
    """The ServiceAccount directory InClusterConfig reads (token, ca.crt), readable by root only."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    for name, data in (("token", token.encode()), ("ca.crt", ca_pem)):
        path = directory / name
        path.write_bytes(data)
        path.chmod(0o600)


def remove_table(netns: Netns) -> bool:
    """Teardown's guarantee: the enforcer's table is gone from the namespace. True when it had to
    be deleted here (the enforcer died without cleaning up)."""
    if not netns.exists():
        return False
    with contextlib.suppress(OSError):
        if TABLE in inet_tables(netns):
            return delete_table(netns, TABLE)
    return False


def prepare(
    netns: Netns,
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
    directory: Path,
    ca_file: Path,
    server: str,
    node_name: str,
    pod_subnet: str,
) -> list[str]:
    """Build the binary if needed, apply its RBAC, mint its token into `directory`; its argv."""
    if not bridge_calls_netfilter(netns):
        raise NetpolError(
            f"net.bridge.bridge-nf-call-iptables is not 1 in network namespace {netns.name} (or br_netfilter is "
            "missing): pod-to-pod traffic on the node's bridge would bypass NetworkPolicy; load br_netfilter"
        )
    exe = build.ensure_built([NAME])[NAME]
    if not nft_queue_supported():
        install_diversion(netns, pod_subnet)
    kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(rbac_manifests()))
    minted = kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, f"--duration={TOKEN_DURATION}")
    write_secrets(directory, minted.stdout.strip(), ca_file.read_bytes())
    return enforcer_argv(exe, directory, server, node_name)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the one signal on which it removes its table), then SIGKILL past the timeout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
