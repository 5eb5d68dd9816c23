"""Publish what the engine holds on the sidecar's own Pod: the report channel's writer (shell).

One strategic-merge PATCH of ``pods/<self>/status`` carries both the annotation
``lorapool.io/adapters`` and the pod condition ``lorapool.io/adapters-synced``
(``lorapool.api.report``), written with the Pod's ServiceAccount token, which is projected
into the sidecar container only; the Role allows ``patch`` on ``pods/status`` in the pool's
namespace and nothing else. ``core.Pacer`` decides when: nothing while nothing changes, at
most one write per ``min_interval_s`` while adapters load, retries with backoff.

Credentials: ``--report-kubeconfig`` (local playground and tests: a ServiceAccount token
kubeconfig), else in-cluster (``KUBERNETES_SERVICE_HOST`` and the token file, re-read before
each write because the kubelet rotates it). The Pod: ``--pod NAMESPACE/NAME``, else
``$POD_NAMESPACE``/``$POD_NAME`` from the downward API. Without a Pod, reporting is off.

``Observer`` scrapes the engine's own ``/metrics`` next to the sidecar (loopback in the pod)
every ``sample_s`` and keeps the last closed window's ``Observations`` (``sidecar.observations``);
the report carries them, so they change, and cost a write, once per window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from lorapool.api.report import Observations
from lorapool.sidecar.core import Pacer
from lorapool.sidecar.observations import Window, parse_sample

log = logging.getLogger("lorapool.sidecar")

TOKEN_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


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


@dataclass(frozen=True)
class ApiServer:
    """Where and as whom to write: base URL, TLS context, and a token read when needed."""

    url: str
    ssl_context: ssl.SSLContext
    token: Callable[[], str | None]


def api_server(kubeconfig: Path | None) -> ApiServer:
    """Credentials from ``kubeconfig`` when given, else in-cluster; raises ValueError saying what is missing."""
    if kubeconfig is not None:
        from kubernetes import client, config

        conf = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
        ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert) if conf.ssl_ca_cert else ssl.create_default_context()
        if conf.cert_file and conf.key_file:
            ctx.load_cert_chain(conf.cert_file, conf.key_file)
        header = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
        static = header.partition(" ")[2] if header and " " in header else header
        return ApiServer(conf.host.rstrip("/"), ctx, lambda: static)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ValueError("no --report-kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST unset)")
    token_file = TOKEN_DIR / "token"

    def token() -> str | None:
        with contextlib.suppress(OSError):
            return token_file.read_text().strip()
        return None

    ctx = ssl.create_default_context(cafile=str(TOKEN_DIR / "ca.crt"))
    return ApiServer(f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}", ctx, token)


Build = Callable[[], dict[str, Any]]  # -> the strategic-merge patch body to send


class Reporter:
    """Sends ``build()``'s patch whenever it differs from the last one sent, paced by ``core.Pacer``."""

    def __init__(
        self,
        server: ApiServer,
        pod: PodRef,
        build: Build,
        *,
        min_interval_s: float = 2.0,
        check_s: float = 0.5,
        timeout_s: float = 10.0,
        on_write: Callable[[bool], None] | None = None,
    ) -> None:
        self.server, self.pod, self.build = server, pod, build
        self.pacer = Pacer(min_interval_s=min_interval_s)
        self.check_s = check_s
        self.timeout_s = timeout_s
        self.on_write = on_write or (lambda ok: None)
        self.writes = 0
        self.last_error: str | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.pod.namespace}/pods/{self.pod.name}/status"

    async def run(self, stop: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(ssl=self.server.ssl_context)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            while not stop.is_set():
                document = json.dumps(self.build(), sort_keys=True)
                due = self.pacer.next_write_at(document, time.monotonic())
                if due is not None and due <= time.monotonic():
                    await self._send(session, document)
                    continue
                wait = self.check_s if due is None else min(self.check_s, due - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(wait, 0.01))

    async def _send(self, session: aiohttp.ClientSession, document: str) -> None:
        headers = {"Content-Type": "application/strategic-merge-patch+json", "Accept": "application/json"}
        if token := self.server.token():
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with session.patch(self.server.url + self.path, data=document, headers=headers) as resp:
                if resp.status >= 400:
                    body = (await resp.text())[:500]
                    raise RuntimeError(f"HTTP {resp.status}: {body}")
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError) as exc:
            self.pacer = self.pacer.failed(time.monotonic())
            error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc)
            if error != self.last_error:
                log.warning(
                    "Failed to report adapters on Pod",
                    extra={"kv": {"pod": f"{self.pod.namespace}/{self.pod.name}", "error": error}},
                )
            self.last_error = error
            self.on_write(False)
            return
        self.pacer = self.pacer.sent(document, time.monotonic())
        self.writes += 1
        if self.last_error is not None:
            log.info("Reported adapters on Pod again", extra={"kv": {"pod": f"{self.pod.namespace}/{self.pod.name}"}})
        self.last_error = None
        self.on_write(True)


class Observer:
    """Samples the engine's ``/metrics`` every ``sample_s``; ``latest`` is the last closed window."""

    def __init__(
        self,
        engine_url: str,
        *,
        window_s: float = 60.0,
        sample_s: float = 2.0,
        timeout_s: float = 5.0,
        headers: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = engine_url.rstrip("/") + "/metrics"
        self.window = Window(window_s=window_s, max_gap_s=max(5 * sample_s, 10.0))
        self.sample_s = sample_s
        self.timeout_s = timeout_s
        self.headers = headers or {}
        self.clock = clock
        self.latest: Observations | None = None
        self.last_error: str | None = None

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                await self.sample(session)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.sample_s)

    async def sample(self, session: aiohttp.ClientSession) -> None:
        """One scrape; a failed one is skipped (the window's time weights absorb the gap)."""
        try:
            async with session.get(self.url, headers=self.headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status} from {self.url}")
                sample = parse_sample(await resp.text())
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != self.last_error:
                log.warning("Failed to read engine metrics", extra={"kv": {"url": self.url, "error": error}})
            self.last_error = error
            return
        self.last_error = None
        if (closed := self.window.add(sample, self.clock())) is not None:
            self.latest = closed
