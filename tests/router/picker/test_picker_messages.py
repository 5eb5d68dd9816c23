"""How few messages the picker answers with under FULL_DUPLEX_STREAMED (issue 47 item 3): every
message is a gRPC write and a wakeup on both sides, the picker's main cost. The request body goes
back in one piece after the pick; a JSON answer goes back whole at its end (in pieces of at most
``ECHO_PIECE_BYTES`` when large); an event stream's chunks go on at once. Driven by a gRPC client
against a real router process, and the pure pieces table-driven."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

from lorapool.router.picker import protocol
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from ..conftest import StartRouter, StartSim
from .test_picker_grpc import Stream, destination, headers

pytestmark = pytest.mark.timeout(60)
PIECE = protocol.ECHO_PIECE_BYTES


def _echoed(answer: Any, phase: str) -> tuple[bytes, bool]:
    streamed = getattr(answer, phase).response.body_mutation.streamed_response
    return streamed.body, streamed.end_of_stream


@pytest.mark.parametrize(
    ("size", "end", "pieces"),
    [
        (0, True, [(0, True)]),
        (10, True, [(10, True)]),
        (PIECE, True, [(PIECE, True)]),
        (PIECE + 1, True, [(PIECE, False), (1, True)]),
        (2 * PIECE + 5, False, [(PIECE, False), (PIECE, False), (5, False)]),
    ],
    ids=["empty-end", "small", "one-full-piece", "just-over", "not-the-end"],
)
def test_held_bytes_go_back_in_the_fewest_pieces(size: int, end: bool, pieces: list[tuple[int, bool]]) -> None:
    body = bytes(i % 251 for i in range(size))
    answers = protocol.echo_held(body, end, phase="response_body")
    got = [_echoed(a, "response_body") for a in answers]
    assert [(len(b), e) for b, e in got] == pieces
    assert b"".join(b for b, _ in got) == body  # unchanged, in order


@pytest.fixture
def picker(start_sim: StartSim, start_router: StartRouter) -> Iterator[tuple[Any, str]]:
    """A router with --ext-proc-port (plaintext) over one simulator: (stub, router URL)."""
    port = free_port()
    router = start_router([start_sim(time_scale=0)], extra=["--ext-proc-port", str(port), "--ext-proc-insecure"])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield ext_grpc.ExternalProcessorStub(channel), router


def _chunk(data: bytes, end: bool, phase: str = "request_body") -> Any:
    return ext.ProcessingRequest(**{phase: ext.HttpBody(body=data, end_of_stream=end)})


def _response_headers(content_type: str) -> Any:
    values = {":status": "200", "content-type": content_type}
    return ext.ProcessingRequest(
        response_headers=ext.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
            )
        )
    )


def _picked(stub: Any) -> Stream:
    """A stream whose request body came in three chunks (the last empty, as Envoy ends a body): the
    pick, then the body in one piece; then the response's headers answered."""
    data = json.dumps({"model": "sql", "prompt": "x", "max_tokens": 1}).encode()
    stream = Stream(stub)
    stream.send(headers(), _chunk(data[:7], False), _chunk(data[7:], False), _chunk(b"", True))
    assert destination(stream.answer())
    assert _echoed(stream.answer(), "request_body") == (data, True)
    return stream


def test_a_json_answer_goes_back_whole_at_its_end(picker: tuple[Any, str]) -> None:
    stub, router = picker
    stream = _picked(stub)

    def inflight() -> float:
        return metric(scrape(router), "lorapool_router_backend_inflight")

    assert inflight() == 1
    stream.send(_response_headers("application/json"))
    assert stream.answer().HasField("response_headers")
    stream.send(_chunk(b'{"id": ', False, "response_body"), _chunk(b"1}", False, "response_body"))
    stream.send(_chunk(b"", True, "response_body"))
    # Had either chunk been answered on its own, this first answer would hold only its bytes.
    assert _echoed(stream.answer(), "response_body") == (b'{"id": 1}', True)
    wait_until("the slot released at the answer's end", lambda: inflight() == 0, 10)
    stream.close()


def test_a_large_json_answer_goes_back_in_pieces_as_it_comes(picker: tuple[Any, str]) -> None:
    stub, _ = picker
    stream = _picked(stub)
    stream.send(_response_headers("application/json"))
    stream.answer()
    first, second = b"a" * (PIECE - 10), b"b" * 20
    stream.send(_chunk(first, False, "response_body"), _chunk(second, False, "response_body"))
    assert _echoed(stream.answer(), "response_body") == ((first + second)[:PIECE], False)  # before the end
    assert _echoed(stream.answer(), "response_body") == ((first + second)[PIECE:], False)
    stream.send(_chunk(b"", True, "response_body"))
    assert _echoed(stream.answer(), "response_body") == (b"", True)
    stream.close()


def test_an_event_stream_goes_on_chunk_by_chunk(picker: tuple[Any, str]) -> None:
    stub, _ = picker
    stream = _picked(stub)
    stream.send(_response_headers("text/event-stream"))
    stream.answer()
    for data in (b"data: 1\n\n", b"data: 2\n\n"):
        stream.send(_chunk(data, False, "response_body"))
        assert _echoed(stream.answer(), "response_body") == (data, False)  # at once, not at the end
    stream.send(_chunk(b"", True, "response_body"))
    assert _echoed(stream.answer(), "response_body") == (b"", True)
    stream.close()


def test_trailers_end_a_held_answer_and_come_after_it(picker: tuple[Any, str]) -> None:
    stub, _ = picker
    stream = _picked(stub)
    stream.send(_response_headers("application/json"))
    stream.answer()
    stream.send(_chunk(b"{}", False, "response_body"), ext.ProcessingRequest(response_trailers=ext.HttpTrailers()))
    assert _echoed(stream.answer(), "response_body") == (b"{}", False)
    assert stream.answer().HasField("response_trailers")
    stream.close()
