"""The picker's pure message layer: what it reads from Envoy, what it answers, and the body's model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import json_format

from lorapool.router.core.openai import BadBody, requested_model
from lorapool.router.picker import protocol
from lorapool.router.picker.endpoints import endpoint


def with_metadata(metadata: dict[str, Any]) -> Any:
    message = ext.ProcessingRequest(request_headers=ext.HttpHeaders())
    for namespace, fields in metadata.items():
        message.metadata_context.filter_metadata[namespace].update(fields)
    return message


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({}, None),
        ({"envoy.lb.subset_hint": {}}, None),
        ({"envoy.lb.subset_hint": {protocol.SUBSET_KEY: ""}}, frozenset()),
        ({"envoy.lb.subset_hint": {protocol.SUBSET_KEY: "10.0.0.1:8000"}}, {"10.0.0.1:8000"}),
        (
            {"envoy.lb.subset_hint": {protocol.SUBSET_KEY: "10.0.0.1:8000, 10.0.0.2:8000"}},
            {"10.0.0.1:8000", "10.0.0.2:8000"},
        ),
        ({"envoy.lb.subset_hint": {protocol.SUBSET_KEY: ["10.0.0.1:8000", "10.0.0.2"]}}, {"10.0.0.1:8000", "10.0.0.2"}),
        ({"envoy.lb.subset_hint": {protocol.SUBSET_KEY: []}}, frozenset()),
    ],
    ids=["no-namespace", "no-key", "empty-string", "one", "comma-separated", "list", "empty-list"],
)
def test_subset_hint(metadata: dict[str, Any], expected: set[str] | None) -> None:
    got = protocol.subset_of(with_metadata(metadata))
    assert got == (None if expected is None else frozenset(expected))


@pytest.mark.parametrize(
    ("endpoint_", "subset", "inside"),
    [
        ("10.0.0.1:8000", {"10.0.0.1:8000"}, True),
        ("10.0.0.1:8000", {"10.0.0.1"}, True),  # a bare IP admits any port
        ("10.0.0.1:8000", {"10.0.0.1:9000"}, False),
        ("[fd00::1]:8000", {"fd00::1"}, True),
        ("10.0.0.1:8000", set(), False),
    ],
    ids=["ip-port", "bare-ip", "other-port", "ipv6-bare", "empty"],
)
def test_in_subset(endpoint_: str, subset: set[str], inside: bool) -> None:
    assert protocol.in_subset(endpoint_, frozenset(subset)) is inside


def test_served_endpoint_is_read_from_envoy_lb() -> None:
    assert protocol.served_of(with_metadata({})) is None
    assert protocol.served_of(with_metadata({"envoy.lb": {protocol.SERVED_KEY: "10.0.0.2:8000"}})) == "10.0.0.2:8000"
    assert protocol.served_of(with_metadata({"envoy.lb": {protocol.SERVED_KEY: "  "}})) is None


def test_headers_prefer_raw_value_and_lower_case_names() -> None:
    headers = ext.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions"),
                base_pb2.HeaderValue(key="X-Gateway-Model-Name", value="sql"),
            ]
        )
    )
    assert protocol.headers_of(headers) == {":path": "/v1/completions", "x-gateway-model-name": "sql"}


@pytest.mark.parametrize("phase", ["request_headers", "request_body"])
def test_the_pick_is_the_same_value_in_header_and_metadata(phase: str) -> None:
    answer = protocol.picked(["10.0.0.1:8000", "10.0.0.2:8000"], phase=phase)
    assert answer.WhichOneof("response") == phase
    common = getattr(answer, phase).response
    assert common.clear_route_cache
    (header,) = common.header_mutation.set_headers
    assert header.header.key == protocol.DESTINATION
    assert header.header.raw_value == b"10.0.0.1:8000,10.0.0.2:8000"  # primary first, then fallbacks
    assert header.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD  # never the client's value
    metadata = json_format.MessageToDict(answer.dynamic_metadata)
    assert metadata == {"envoy.lb": {protocol.DESTINATION: "10.0.0.1:8000,10.0.0.2:8000"}}


@pytest.mark.parametrize(("status", "retry"), [(503, 1), (429, 1), (404, None), (400, None)])
def test_immediate_errors_carry_status_body_and_retry_after(status: int, retry: int | None) -> None:
    answer = protocol.error(status, "why", "SomeError", param="model", retry_after_s=retry).immediate_response
    assert answer.status.code == status
    assert json.loads(answer.body) == {
        "error": {"message": "why", "type": "SomeError", "param": "model", "code": status}
    }
    headers = {h.header.key: h.header.raw_value.decode() for h in answer.headers.set_headers}
    assert headers["content-type"] == "application/json"
    assert headers.get("retry-after") == (None if retry is None else str(retry))


@pytest.mark.parametrize("phase", ["request_body", "response_body"])
def test_echo_sends_the_chunk_back_unchanged(phase: str) -> None:
    answer = protocol.echo(b"data: {}\n\n", True, phase=phase)
    streamed = getattr(answer, phase).response.body_mutation.streamed_response
    assert streamed.body == b"data: {}\n\n" and streamed.end_of_stream


@pytest.mark.parametrize(
    "phase",
    ["request_headers", "response_headers", "request_body", "response_body", "request_trailers", "response_trailers"],
)
def test_proceed_answers_the_phase_it_was_asked(phase: str) -> None:
    assert protocol.proceed(phase).WhichOneof("response") == phase


@pytest.mark.parametrize(
    ("body", "words", "param"),
    [
        (b"{not json", "not valid JSON", None),
        (b"\xff\xfe", "not valid JSON", None),
        (b"[1, 2]", '"model"', "model"),
        (b'{"prompt": "x"}', '"model"', "model"),
        (b'{"model": 7}', '"model"', "model"),
        (b'{"model": ""}', '"model"', "model"),
    ],
    ids=["broken", "not-utf8", "a-list", "no-model", "model-not-a-string", "empty-model"],
)
def test_bad_bodies_say_what_is_wrong(body: bytes, words: str, param: str | None) -> None:
    with pytest.raises(BadBody, match=words) as caught:
        requested_model(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_the_model_is_read_from_a_good_body() -> None:
    assert requested_model(json.dumps({"model": "sql", "prompt": "x"}).encode()) == "sql"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.1:8000", "10.0.0.1:8000"),
        ("http://10.0.0.1:8000/", "10.0.0.1:8000"),
        ("http://10.0.0.1", "10.0.0.1:80"),
        ("https://10.0.0.1", "10.0.0.1:443"),
        ("http://[fd00::1]:8000", "[fd00::1]:8000"),
        ("http://localhost:8000", "127.0.0.1:8000"),  # ORIGINAL_DST needs an IP literal: resolved
    ],
    ids=["ipv4", "trailing-slash", "default-http", "default-https", "ipv6", "host-name"],
)
def test_backend_urls_become_ip_port(url: str, expected: str) -> None:
    assert endpoint(url) == expected


def test_an_unresolved_host_name_is_refused_when_resolving_is_off() -> None:
    with pytest.raises(ValueError, match="not an IP literal"):
        endpoint("http://engine-0.pool:8000", resolve=False)
