"""Runs the endpoint picker beside the HTTP proxy: the ext_proc gRPC listener and its health.

Shell, started by ``router.server.serve`` when ``--ext-proc-port`` is given. grpc.aio runs on the
router's own event loop, so the picker drives the one scheduler the proxy drives, with no lock.
The ext_proc listener serves TLS unless ``--ext-proc-insecure``; gRPC health (``liveness``,
``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor``) is served on
``--ext-proc-health-port``, plaintext, as GIE's reference picker does. Readiness follows
``/health``: SERVING while a backend is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from lorapool.router.core.requestcount import RequestCounter
from lorapool.router.lifecycle import Lifecycle, ReadOnlyBackendState, Scheduler
from lorapool.router.picker.endpoints import Endpoints
from lorapool.router.picker.service import Picker
from lorapool.router.picker.tls import load_pair
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router.picker")

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("readiness", SERVICE, "")
# Each picker stream is one HTTP request; a gateway keeps one connection open and multiplexes them.
MAX_CONCURRENT_STREAMS = 100_000
SHUTDOWN_GRACE_S = 5.0
MESSAGE_SLACK_BYTES = 64 * 1024  # headers and framing around a body


@dataclass
class RunningPicker:
    servers: list[grpc.aio.Server]
    health_task: asyncio.Task[None] | None

    async def stop(self) -> None:
        if self.health_task is not None:
            self.health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.health_task
        await asyncio.gather(*(s.stop(SHUTDOWN_GRACE_S) for s in self.servers))


async def start_picker(
    scheduler: Scheduler,
    telemetry: Telemetry,
    settings: RouterSettings,
    requests: RequestCounter,
    upstream: Mapping[str, str] | None = None,
) -> RunningPicker:
    """Listen on ``--ext-proc-port`` (and ``--ext-proc-health-port``); returns the running servers.
    ``upstream``: headers set on every picked request (the engines' API key)."""
    assert settings.ext_proc_port is not None
    # One message may carry a whole request body (BUFFERED, or a fast client): up to --max-body-bytes.
    message_bytes = max(settings.max_body_bytes + MESSAGE_SLACK_BYTES, 4 * 1024 * 1024)
    options = [
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", message_bytes),
        ("grpc.max_send_message_length", message_bytes),
    ]
    server = grpc.aio.server(options=options)
    lifecycle = Lifecycle(scheduler, telemetry, settings, requests)
    picker = Picker(lifecycle, settings, Endpoints(), upstream)
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    address = f"{settings.host}:{settings.ext_proc_port}"
    if settings.ext_proc_insecure:
        server.add_insecure_port(address)
    else:
        pair = load_pair(settings.ext_proc_tls_cert, settings.ext_proc_tls_key)
        server.add_secure_port(address, grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)]))
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)  # on the ext_proc port too, as gRPC clients expect
    servers = [server]
    if settings.ext_proc_health_port is not None:
        plain = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(health, plain)
        plain.add_insecure_port(f"{settings.host}:{settings.ext_proc_health_port}")
        servers.append(plain)
    for s in servers:
        await s.start()
    await health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
    task = asyncio.get_running_loop().create_task(
        _follow_readiness(health, lifecycle.backends, settings.poll_interval_s)
    )
    log.info(
        "Started endpoint picker",
        extra={"address": address, "tls": not settings.ext_proc_insecure, "health_port": settings.ext_proc_health_port},
    )
    return RunningPicker(servers, task)


async def _follow_readiness(
    health: HealthServicer, backends: Callable[[], list[ReadOnlyBackendState]], interval_s: float
) -> None:
    """Readiness (and the ext_proc service's status) is SERVING while a backend is up, as /health."""
    while True:
        up = any(s.up for s in backends())
        status = health_pb2.HealthCheckResponse.SERVING if up else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in READY_SERVICES:
            await health.set(service, status)
        await asyncio.sleep(interval_s)
