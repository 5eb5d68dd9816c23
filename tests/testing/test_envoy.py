"""lorapool_dev.testing.envoy's bootstrap: a pure function of the gateway's settings (Envoy itself runs in
tests/router/test_extproc_envoy.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lorapool_dev.testing.envoy import (
    FALLBACK_CLUSTER,
    PICKER_CLUSTER,
    POOL_CLUSTER,
    BodyMode,
    FailureMode,
    GatewayConfig,
    bootstrap,
)

BASE = GatewayConfig(listen_port=10000, picker="127.0.0.1:9002", admin_port=10001)


def ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (found,) = [f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
    return dict(found)


def clusters(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in config["static_resources"]["clusters"]}


def routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return list(hcm["route_config"]["virtual_hosts"][0]["routes"])


@pytest.mark.parametrize(
    ("mode", "trailers"),
    [(BodyMode.FULL_DUPLEX_STREAMED, "SEND"), (BodyMode.BUFFERED, "SKIP"), (BodyMode.STREAMED, "SKIP")],
    ids=["full-duplex", "buffered", "streamed"],
)
def test_processing_mode_both_ways(mode: BodyMode, trailers: str) -> None:
    got = ext_proc(bootstrap(replace(BASE, body_mode=mode)))["processing_mode"]
    assert got["request_body_mode"] == got["response_body_mode"] == mode.value
    assert got["request_trailer_mode"] == got["response_trailer_mode"] == trailers  # Envoy wants SEND with full duplex


def test_the_pool_is_an_original_dst_cluster_on_the_destination_header() -> None:
    pool = clusters(bootstrap(BASE))[POOL_CLUSTER]
    assert pool["type"] == "ORIGINAL_DST" and pool["lb_policy"] == "CLUSTER_PROVIDED"
    assert pool["original_dst_lb_config"] == {
        "use_http_header": True,
        "http_header_name": "x-gateway-destination-endpoint",
    }


def test_tls_to_the_picker_by_default_verified_only_with_a_ca() -> None:
    picker = clusters(bootstrap(BASE))[PICKER_CLUSTER]
    tls = picker["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls == {"alpn_protocols": ["h2"]}
    verified = clusters(bootstrap(replace(BASE, picker_ca="/ca.pem")))[PICKER_CLUSTER]
    ca = verified["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]
    assert ca == {"trusted_ca": {"filename": "/ca.pem"}}
    plain = clusters(bootstrap(replace(BASE, tls=False)))[PICKER_CLUSTER]
    assert "transport_socket" not in plain


def test_fail_close_has_no_fallback_route() -> None:
    config = bootstrap(BASE)
    assert ext_proc(config)["failure_mode_allow"] is False
    assert FALLBACK_CLUSTER not in clusters(config)
    assert all(r["route"]["cluster"] == POOL_CLUSTER for r in routes(config))


def test_fail_open_routes_an_unpicked_request_to_every_endpoint() -> None:
    endpoints = ["10.0.0.1:8000", "10.0.0.2:8000"]
    config = bootstrap(replace(BASE, failure_mode=FailureMode.FAIL_OPEN, fallback_endpoints=endpoints))
    assert ext_proc(config)["failure_mode_allow"] is True
    picked, fallback = routes(config)
    assert picked["match"]["headers"] == [{"name": "x-gateway-destination-endpoint", "present_match": True}]
    assert fallback["route"]["cluster"] == FALLBACK_CLUSTER
    lb = clusters(config)[FALLBACK_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in lb] == [
        {"address": "10.0.0.1", "port_value": 8000},
        {"address": "10.0.0.2", "port_value": 8000},
    ]


def test_message_timeout_and_forwarded_metadata() -> None:
    got = ext_proc(bootstrap(replace(BASE, message_timeout_s=2.5)))
    assert got["message_timeout"] == "2.5s"
    assert got["metadata_options"] == {"forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]}}


def test_the_failure_mode_picks_the_body_modes_that_keep_its_promise() -> None:
    closed = ext_proc(bootstrap(BASE))
    assert closed["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert closed["status_on_error"] == {"code": 503}  # a lost picker: unavailable, at once
    opened = ext_proc(
        bootstrap(replace(BASE, failure_mode=FailureMode.FAIL_OPEN, fallback_endpoints=["10.0.0.1:8000"]))
    )
    mode = opened["processing_mode"]
    # envoy#41276: full duplex fails closed once the body reached the picker; buffered requests do not.
    assert (mode["request_body_mode"], mode["response_body_mode"]) == ("BUFFERED", "STREAMED")
    assert mode["request_trailer_mode"] == mode["response_trailer_mode"] == "SKIP"
