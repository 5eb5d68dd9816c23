"""Network namespaces of the real node, and the one loopback relay that reaches into them.

Called by `lorapool_dev.cluster.node`. The whole real node (control plane, containerd, kubelet,
kube-proxy, the pods' bridge) lives in one namespace made per run (`lp-<run id>`), so none of
its traffic can reach an address of this machine: the namespace has loopback (which also holds the
node's IP), the pods' bridge, and no route out. Nothing in the root namespace changes but the
namespace's own bind mount under /run/netns: no veth, no address, no route, no sysctl.

Root-namespace clients (tests, kubectl) reach the API server through `Relay`: it listens on
127.0.0.1:<port> here and connects to 127.0.0.1:<same port> in the namespace, so one
kubeconfig is valid on both sides. Both ends are loopback addresses.

A thread enters a namespace with setns(2) (`entered`): sockets it opens and processes it starts
belong to that namespace; other threads are untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import selectors
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")


class NetnsError(RuntimeError):
    """A namespace could not be made, entered or removed."""


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise NetnsError(f"setns(CLONE_NEWNET) failed: {os.strerror(code)} (errno {code}); it needs root")


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


@dataclass(frozen=True)
class Netns:
    """One named network namespace (a bind mount under /run/netns)."""

    name: str

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def exists(self) -> bool:
        return self.path.exists()

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Move the calling thread into the namespace, and back to where it was on exit."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(self.path, os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)

    def enter(self) -> None:
        """Move the calling thread into the namespace for good: a `preexec_fn` (the child joins
        it before it execs) or a thread that ends with its work."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        """Processes whose network namespace is this one (what teardown must end)."""
        try:
            wanted = os.stat(self.path)
        except FileNotFoundError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                ns = os.stat(entry / "ns" / "net")
                if (ns.st_dev, ns.st_ino) == (wanted.st_dev, wanted.st_ino):
                    found.append(int(entry.name))
        return found


def create(name: str, node_ip: str) -> Netns:
    """A fresh namespace with loopback up, holding `node_ip`/32 too: the kubelet refuses
    127.0.0.1 as a node IP, and the API server advertises this address to pods. (On loopback
    because this kernel has no dummy interfaces.)"""
    netns = Netns(name)
    if netns.exists():
        raise NetnsError(f"network namespace {name} already exists; delete it with `ip netns delete {name}`")
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "addr", "add", f"{node_ip}/32", "dev", "lo")
    except NetnsError:
        delete(netns)
        raise
    return netns


def delete(netns: Netns) -> None:
    """Remove the namespace's bind mount (the kernel frees it once no process is left in it)."""
    if netns.exists():
        _ip("netns", "delete", netns.name)


class Relay:
    """Forward 127.0.0.1:<port> of the root namespace to 127.0.0.1:<port> inside `netns`.

    One thread: it binds its listener before entering the namespace, then opens every upstream
    connection from inside it and shuttles bytes with a selector until `close()`.
    """

    CHUNK = 65536

    def __init__(self, netns: Netns, port: int) -> None:
        self.netns = netns
        self.port = port
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._peers: dict[socket.socket, socket.socket] = {}
        self._thread = threading.Thread(target=self._run, name=f"netns-relay-{port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._wake_w.send(b"x")
        self._thread.join(timeout=10)
        for sock in (self._listener, self._wake_r, self._wake_w, *self._peers):
            sock.close()
        self._peers.clear()

    def _run(self) -> None:
        self.netns.enter()  # this thread only; it ends with the relay
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    if key.fileobj is self._listener:
                        self._accept(sel)
                    else:
                        self._pump(sel, key.data)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                client.close()
                return
            for sock, peer in ((client, upstream), (upstream, client)):
                sock.setblocking(True)
                self._peers[sock] = peer
                sel.register(sock, selectors.EVENT_READ, data=sock)

    def _pump(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        peer = self._peers.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(self.CHUNK)
            if data:
                peer.sendall(data)
                return
        except OSError as err:
            if err.errno not in (errno.ECONNRESET, errno.EPIPE, errno.EBADF):
                raise
        for end in (sock, peer):
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(end)
            self._peers.pop(end, None)
            end.close()
