"""Write on one's own Pod: a strategic-merge PATCH of ``pods/<self>/status`` (shell).

The sidecar publishes what its engine holds (``lorapool.io/adapters``, ``sidecar.reporter``)
and the router its request counts (``lorapool.io/requests``, ``router.publisher``) this way;
they run alone in their pods and import nothing from each other, so the writing lives here.
The ``status`` subresource, because the Role allows ``patch`` on ``pods/status`` and nothing
else that writes: a compromised container can annotate its own pods' status, not change a spec.

Credentials: a kubeconfig file when given (local playground and tests: a ServiceAccount token
kubeconfig), else in-cluster (``KUBERNETES_SERVICE_HOST`` and the projected token, re-read
before each write because the kubelet rotates it). The Pod: a ``NAMESPACE/NAME`` flag, else
``$POD_NAMESPACE``/``$POD_NAME`` from the downward API.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

TOKEN_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATCH_HEADERS = {"Content-Type": "application/strategic-merge-patch+json", "Accept": "application/json"}
ERROR_BODY_CHARS = 500


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> PodRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name:
            raise ValueError(f"--pod {text!r}: expected NAMESPACE/NAME, e.g. default/llama3-8b-engine-7d9f-abcde")
        return cls(namespace, name)

    @classmethod
    def from_env(cls) -> PodRef | None:
        name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
        return cls(namespace, name) if name and namespace else None

    @property
    def status_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ApiServer:
    """Where and as whom to write: base URL, TLS context, and a token read when needed."""

    url: str
    ssl_context: ssl.SSLContext
    token: Callable[[], str | None]


def api_server(kubeconfig: Path | None) -> ApiServer:
    """Credentials from ``kubeconfig`` when given, else in-cluster; raises ValueError saying what is missing."""
    if kubeconfig is not None:
        from kubernetes import client

        from lorapool.kubeconfig import load_kube_config

        conf = client.Configuration()
        load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
        ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert) if conf.ssl_ca_cert else ssl.create_default_context()
        if conf.cert_file and conf.key_file:
            ctx.load_cert_chain(conf.cert_file, conf.key_file)
        header = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
        static = header.partition(" ")[2] if header and " " in header else header
        return ApiServer(conf.host.rstrip("/"), ctx, lambda: static)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ValueError("no kubeconfig given and not in a cluster (KUBERNETES_SERVICE_HOST unset)")
    token_file = TOKEN_DIR / "token"

    def token() -> str | None:
        with contextlib.suppress(OSError):
            return token_file.read_text().strip()
        return None

    ctx = ssl.create_default_context(cafile=str(TOKEN_DIR / "ca.crt"))
    return ApiServer(f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}", ctx, token)


def session(server: ApiServer, timeout_s: float) -> aiohttp.ClientSession:
    """An HTTP session to ``server`` (its TLS context; every call bounded by ``timeout_s``)."""
    connector = aiohttp.TCPConnector(ssl=server.ssl_context)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))


async def patch_status(http: aiohttp.ClientSession, server: ApiServer, pod: PodRef, document: str) -> str | None:
    """Send one strategic-merge patch of the Pod's status; returns None when written, else why not.

    Never raises for the API server's or the network's failures: the callers log the reason
    (no credentials in it) and try again later."""
    headers = dict(PATCH_HEADERS)
    if token := server.token():
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with http.patch(server.url + pod.status_path, data=document, headers=headers) as resp:
            if resp.status >= 400:
                return f"HTTP {resp.status}: {(await resp.text())[:ERROR_BODY_CHARS]}"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
