"""The endpoint picker protocol's messages: what Envoy tells the picker, what the picker answers. Pure.

The Gateway API Inference Extension's protocol (docs/proposals/004-endpoint-picker-protocol) over
Envoy's ext_proc v3: read the subset hint and the endpoint that served from the filter metadata,
the ``model`` from the request body; answer with the picked endpoint (header and dynamic metadata,
the same value in both), an immediate error response, or the body chunk echoed (full duplex).
Builds protobuf messages only; ``picker.service`` sends them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from lorapool.router.core.openai import error_body

DESTINATION = "x-gateway-destination-endpoint"  # header and key in ``envoy.lb``: ip:port[,ip:port...]
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"  # the endpoints the picker may choose from
SERVED_KEY = "x-gateway-destination-endpoint-served"  # in ``envoy.lb``: the endpoint that answered
# Set by GIE's body-based routing (or any client): the model is known before the body arrives.
MODEL_HEADER = "x-gateway-model-name"
# Envoy's router adds it to every response that came from an upstream; its own 503s lack it.
UPSTREAM_TIME = "x-envoy-upstream-service-time"

# The body send modes Envoy names in the first message's ``protocol_config``.
STREAMED: int = processing_mode_pb2.ProcessingMode.STREAMED
BUFFERED: int = processing_mode_pb2.ProcessingMode.BUFFERED
FULL_DUPLEX_STREAMED: int = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED

Response = Any  # ext.ProcessingResponse (protobuf classes carry no static types)
# The largest body piece in one echo: some data planes cap a streamed chunk at 64 KiB (GIE's
# picker sends 62,000 bytes at most for the same reason).
ECHO_PIECE_BYTES = 62_000


def headers_of(message: Any) -> dict[str, str]:
    """An ``HttpHeaders``' headers by lower-case name (``raw_value`` wins over ``value``, as Envoy sends)."""
    return {
        h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in message.headers.headers
    }


def _namespace(request: Any, namespace: str) -> Any:
    """The ``Struct`` of one filter-metadata namespace the data plane forwarded, or None."""
    fields = request.metadata_context.filter_metadata
    return fields[namespace] if namespace in fields else None  # noqa: SIM401 (a protobuf map has no .get default)


def subset_of(request: Any) -> frozenset[str] | None:
    """The subset hint's endpoints (``ip:port`` or a bare ``ip``), or None when the data plane set none.

    A list or one comma-separated string (what a header-to-metadata rule writes) are both read."""
    hint = _namespace(request, SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    value = hint.fields[SUBSET_KEY]
    listed = value.HasField("list_value")
    items: Iterable[str] = (v.string_value for v in value.list_value.values) if listed else (value.string_value,)
    return frozenset(e.strip() for item in items for e in item.split(",") if e.strip())


def served_of(request: Any) -> str | None:
    """The endpoint that served, from ``envoy.lb`` / ``x-gateway-destination-endpoint-served``."""
    lb = _namespace(request, LB_NAMESPACE)
    if lb is None or SERVED_KEY not in lb.fields:
        return None
    return str(lb.fields[SERVED_KEY].string_value).strip() or None


def in_subset(endpoint: str, subset: frozenset[str]) -> bool:
    """True when ``endpoint`` (ip:port) is in the hint, by ``ip:port`` or by bare IP (any port)."""
    return endpoint in subset or endpoint.rsplit(":", 1)[0].strip("[]") in subset


def _overwrite(key: str, value: str) -> Any:
    """A header set over whatever the client sent under that name (never a client's own value)."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _mutation(endpoints: Sequence[str], upstream: Mapping[str, str]) -> tuple[Any, struct_pb2.Struct]:
    value = ",".join(endpoints)
    headers = [_overwrite(DESTINATION, value), *(_overwrite(k.lower(), v) for k, v in upstream.items())]
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION: value}})
    return ext.HeaderMutation(set_headers=headers), metadata


def picked(endpoints: Sequence[str], *, phase: str, upstream: Mapping[str, str] | None = None) -> Response:
    """The pick (primary first, then fallbacks) as the answer to ``phase``: ``request_headers``, or
    ``request_body`` when the headers were already let through unanswered (BUFFERED). ``upstream``:
    headers the engines need on every request (their API key, as the HTTP router sends it), set over
    the client's: the gateway sends the request to the engine itself."""
    mutation, metadata = _mutation(endpoints, upstream or {})
    common = ext.CommonResponse(header_mutation=mutation, clear_route_cache=True)
    if phase == "request_headers":
        return ext.ProcessingResponse(request_headers=ext.HeadersResponse(response=common), dynamic_metadata=metadata)
    return ext.ProcessingResponse(request_body=ext.BodyResponse(response=common), dynamic_metadata=metadata)


def immediate(
    status: int,
    body: Mapping[str, Any],
    *,
    retry_after_s: int | None = None,
    details: str = "",
    extra: Sequence[tuple[str, str]] = (),
) -> Response:
    """Answer the client now (no endpoint): ``status`` with an OpenAI-shaped JSON ``body`` (and
    ``extra`` headers: a 429's x-ratelimit-*)."""
    headers = [("content-type", "application/json")]
    if retry_after_s is not None:
        headers.append(("retry-after", str(retry_after_s)))
    headers += [(k.lower(), v) for k, v in extra]
    mutation = ext.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode())) for k, v in headers
        ]
    )
    answer = ext.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=mutation,
        body=json.dumps(body).encode(),
        details=details,
    )
    return ext.ProcessingResponse(immediate_response=answer)


def error(
    status: int,
    message: str,
    kind: str,
    *,
    param: str | None = None,
    retry_after_s: int | None = None,
    extra: Sequence[tuple[str, str]] = (),
) -> Response:
    """An immediate error in the HTTP router's words (``core.openai.error_body``)."""
    body = error_body(status, message, kind, param)
    return immediate(status, body, retry_after_s=retry_after_s, details=kind, extra=extra)


def add_headers(phase: str, headers: Sequence[tuple[str, str]]) -> Response:
    """Go on, with ``headers`` added to the message of ``phase`` (the response's x-ratelimit-*)."""
    if not headers:
        return proceed(phase)
    mutation = ext.HeaderMutation(set_headers=[_overwrite(k.lower(), v) for k, v in headers])
    return ext.ProcessingResponse(**{phase: ext.HeadersResponse(response=ext.CommonResponse(header_mutation=mutation))})


def echo(chunk: bytes, end_of_stream: bool, *, phase: str) -> Response:
    """A body chunk sent back unchanged (FULL_DUPLEX_STREAMED: what is not sent back is dropped)."""
    streamed = ext.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
    common = ext.CommonResponse(body_mutation=ext.BodyMutation(streamed_response=streamed))
    return ext.ProcessingResponse(**{phase: ext.BodyResponse(response=common)})


def echo_held(body: bytes, end_of_stream: bool, *, phase: str) -> list[Response]:
    """Held body bytes sent back in as few messages as Envoy takes: pieces of at most
    ``ECHO_PIECE_BYTES``, ``end_of_stream`` on the last. Each message is a gRPC write and a
    wakeup on both sides, so an empty end-of-stream chunk is not echoed on its own (GIE's picker
    answers the same way)."""
    if len(body) <= ECHO_PIECE_BYTES:
        return [echo(body, end_of_stream, phase=phase)]
    starts = range(0, len(body), ECHO_PIECE_BYTES)
    last = starts[-1]
    return [echo(body[i : i + ECHO_PIECE_BYTES], end_of_stream and i == last, phase=phase) for i in starts]


def proceed(phase: str) -> Response:
    """Go on unchanged: the answer to headers, a body (BUFFERED/STREAMED) or trailers of ``phase``."""
    if phase.endswith("trailers"):
        return ext.ProcessingResponse(**{phase: ext.TrailersResponse()})
    if phase.endswith("headers"):
        return ext.ProcessingResponse(**{phase: ext.HeadersResponse()})
    return ext.ProcessingResponse(**{phase: ext.BodyResponse()})
