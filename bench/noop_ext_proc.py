"""An ext_proc server with no policy: the floor under ``envoy + lorapool picker``'s latency.

    python -m bench.noop_ext_proc --port 9002 --endpoint 127.0.0.1:8001 [--insecure]

It speaks the endpoint picker protocol exactly as ``lorapool router --ext-proc-port`` does under
``FULL_DUPLEX_STREAMED`` (the same answers from ``router.picker.protocol``: the pick after the
request body's end, the body echoed in one piece, an event stream's chunks at once and a JSON
answer whole at its end, TLS with a self-signed pair by default), but names
the one ``--endpoint`` without parsing the body, scheduling or counting, on the router's event loop (uvloop). Behind the same Envoy
in the overhead cell, the gap between it and the picker is what lorapool's policy costs; what it
adds over plain Envoy is what a Python gRPC ext_proc round trip costs (bench/overhead.py).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

from lorapool.router.picker import protocol
from lorapool.router.picker.tls import self_signed
from lorapool.router.server import loop_factory


class NoopPicker:
    """``ExternalProcessor.Process``: pick ``endpoint`` for every request, echo every chunk."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        held: list[bytes] = []
        stream = False  # the response is an event stream: its chunks go on at once
        async for message in requests:
            kind = message.WhichOneof("request")
            if kind == "request_headers":
                if message.request_headers.end_of_stream:
                    yield protocol.picked([self.endpoint], phase="request_headers")
                continue  # full duplex: the header answer waits for the body's end, as the picker's does
            if kind == "request_body":
                held.append(message.request_body.body)
                if message.request_body.end_of_stream:
                    yield protocol.picked([self.endpoint], phase="request_headers")
                    for answer in protocol.echo_held(b"".join(held), True, phase="request_body"):
                        yield answer
                    held = []
                continue
            if kind == "response_headers":
                stream = (
                    protocol.headers_of(message.response_headers)
                    .get("content-type", "")
                    .startswith("text/event-stream")
                )
            if kind == "response_body":  # as the picker answers: an event stream at once, JSON whole at its end
                body = message.response_body
                if stream:
                    yield protocol.echo(body.body, body.end_of_stream, phase="response_body")
                    continue
                held.append(body.body)
                if body.end_of_stream:
                    for answer in protocol.echo_held(b"".join(held), True, phase="response_body"):
                        yield answer
                    held = []
                continue
            yield protocol.proceed(kind)


async def serve(port: int, endpoint: str, *, insecure: bool) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(NoopPicker(endpoint), server)
    address = f"127.0.0.1:{port}"
    if insecure:
        server.add_insecure_port(address)
    else:
        pair = self_signed()
        server.add_secure_port(address, grpc.ssl_server_credentials([(pair.key_pem, pair.cert_pem)]))
    await server.start()
    await server.wait_for_termination()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoint", required=True, help="ip:port every request is sent to")
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC (default: TLS, self-signed)")
    args = parser.parse_args(argv)
    # The router's default loop (uvloop), so the only difference from the picker is the policy.
    with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
        runner.run(serve(args.port, args.endpoint, insecure=args.insecure))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
