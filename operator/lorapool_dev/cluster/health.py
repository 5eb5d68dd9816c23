"""Is the local control plane up: the apiserver's one HTTPS seam (`Api`), the components'
health endpoints, node readiness, and waiting for a condition while every component lives.

Called by `runtime.LocalCluster` (start, restart, status, TokenRequest) and, for `http_ok`, by
`node` (kube-proxy's /healthz). The probes do network I/O; `node_ready` and `message` are pure.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lorapool_dev.cluster.errors import ClusterError
from lorapool_dev.cluster.manifests import Ports
from lorapool_dev.cluster.processes import Process
from lorapool_dev.testing.wait import WaitTimeout, wait_until

log = logging.getLogger("lorapool_dev.cluster")


class Api:
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


def message(answer: Any) -> str:
    """The apiserver's explanation in an error answer (its Status message), for ClusterError texts."""
    if isinstance(answer, dict):
        return str(answer.get("message", answer))
    return str(answer)[:500]


def https_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Components serve /healthz with self-signed certs; only the answer matters here."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200 over plain HTTP (etcd's /health, kube-proxy's /healthz)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def component_health(ports: Ports, server: str) -> dict[str, bool]:
    """Each component's health endpoint answering 200 (KWOK has none), for `lorapool cluster status`."""
    return {
        "etcd": http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"),
        "kube-apiserver": https_ok(f"{server}/readyz"),
        "kube-controller-manager": https_ok(f"https://127.0.0.1:{ports.controller_manager}/healthz"),
        "kube-scheduler": https_ok(f"https://127.0.0.1:{ports.scheduler}/healthz"),
    }


def api_ready(api: Api) -> bool:
    """The apiserver's /readyz answers 200."""
    try:
        return api.request("GET", "/readyz", timeout_s=2.0)[0] == 200
    except OSError:
        return False


def node_ready(node: dict[str, Any]) -> bool:
    """A Node object's Ready condition is True. Pure."""
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def nodes_ready(api: Api, names: set[str]) -> bool:
    """Every Node in ``names`` exists and is Ready."""
    status, answer = api.request("GET", "/api/v1/nodes")
    if status != 200:
        return False
    ready = {n["metadata"]["name"] for n in answer["items"] if node_ready(n)}
    return names <= ready


def wait_while_alive(
    what: str, deadline: float, done: Callable[[], bool], procs: Mapping[str, Process], timeout_s: float
) -> None:
    """Wait until ``done()`` or ``deadline`` (monotonic); a component of ``procs`` that exits
    meanwhile ends the wait at once. Raises ClusterError with the logs that explain either;
    ``timeout_s`` is the budget the message names."""
    began = time.monotonic()

    def check() -> bool:
        for proc in procs.values():
            if not proc.alive():  # not retried: a dead component will not come back by itself
                raise ClusterError(
                    f"{proc.name} exited while waiting for {what}; last lines of {proc.log}:\n{proc.log_tail()}"
                )
        return done()

    try:
        wait_until(what, check, max(0.0, deadline - began), interval_s=0.1)
    except WaitTimeout:
        tails = "\n".join(f"--- {p.log}\n{p.log_tail(10)}" for p in procs.values())
        raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}; component logs:\n{tails}") from None
    log.info("Observed %s seconds=%.1f", what, time.monotonic() - began)
