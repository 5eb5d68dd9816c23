"""The picker fails open itself: a bug of ours while routing a request names a live endpoint
(preferring one that serves the model) instead of failing the stream, whatever the gateway's
failure mode. Behind FULL_DUPLEX_STREAMED a failed stream is an error for the client even with
FailOpen (envoyproxy/envoy#41276), so the picker is where failing open has to happen.

In-process: the fault is a broken lifecycle (a stand-in raising where a bug would), the rest is the
real ``Picker`` answering real ext_proc messages.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from lorapool.router.picker.endpoints import Endpoints
from lorapool.router.picker.service import Picker
from lorapool.router.settings import RouterSettings

from .test_picker_grpc import destination, headers

pytestmark = pytest.mark.timeout(30)


@dataclass
class _Backend:
    id: str
    models: frozenset[str]
    inflight_total: int = 0
    up: bool = True

    def served_models(self) -> frozenset[str]:
        return self.models


class _BrokenLifecycle:
    """Admits nothing: every admission raises, as a bug in a scorer or the books would."""

    def __init__(self, backends: Sequence[_Backend]) -> None:
        self._backends = list(backends)
        self.answered: list[str] = []

    def backends(self) -> list[_Backend]:
        return self._backends

    def admit(self, model: str, start: float, body: Any = None) -> Any:
        raise RuntimeError("a bug while admitting")

    def counted(self, code: str, start: float) -> None:
        self.answered.append(code)


async def _first_answer(picker: Picker, messages: Sequence[Any]) -> Any:
    async def stream() -> AsyncIterator[Any]:
        for m in messages:
            yield m

    answers = picker.Process(stream(), None)
    first = await answers.__anext__()
    await answers.aclose()
    return first


def _body(model: str) -> Any:
    data = json.dumps({"model": model, "prompt": "x", "max_tokens": 1}).encode()
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=data, end_of_stream=True))


@pytest.mark.parametrize(
    ("backends", "want"),
    [
        # The one that serves the model, though busier.
        (
            [
                _Backend("http://127.0.0.1:8001", frozenset({"chat"})),
                _Backend("http://127.0.0.1:8002", frozenset({"sql"}), 5),
            ],
            "127.0.0.1:8002",
        ),
        # Nobody serves it: the least loaded live backend (the engine answers for itself).
        (
            [_Backend("http://127.0.0.1:8001", frozenset(), 3), _Backend("http://127.0.0.1:8002", frozenset(), 1)],
            "127.0.0.1:8002",
        ),
        # A backend that is down is never named.
        (
            [
                _Backend("http://127.0.0.1:8001", frozenset({"sql"}), up=False),
                _Backend("http://127.0.0.1:8002", frozenset()),
            ],
            "127.0.0.1:8002",
        ),
    ],
    ids=["serving", "least-loaded", "not-down"],
)
def test_an_internal_error_names_a_live_endpoint(backends: list[_Backend], want: str) -> None:
    picker = Picker(_BrokenLifecycle(backends), RouterSettings(), Endpoints())  # type: ignore[arg-type]
    answer = asyncio.run(_first_answer(picker, [headers(), _body("sql")]))
    assert destination(answer) == want


def test_with_no_live_backend_it_answers_503_not_an_error() -> None:
    down = [_Backend("http://127.0.0.1:8001", frozenset({"sql"}), up=False)]
    picker = Picker(_BrokenLifecycle(down), RouterSettings(), Endpoints())  # type: ignore[arg-type]
    answer = asyncio.run(_first_answer(picker, [headers(), _body("sql")]))
    assert answer.immediate_response.status.code == 503
