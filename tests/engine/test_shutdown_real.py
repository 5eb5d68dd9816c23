"""SIGTERM with requests in flight, the simulator beside real vLLM (CPU build 0.32).

vLLM's ``--shutdown-timeout`` decides (its engine core's ``_handle_shutdown``): N > 0 drains (new
requests get a 500, ``cannot schedule new futures after shutdown``, those in flight finish for up
to N seconds), 0 aborts (each request in flight is answered at once with what it has and
finish_reason ``abort``; measured on the CPU build: a 200 for both a plain and a streamed request,
the listener closed within a second). The operator renders the draining form for the engines
(a rolling update must not cut requests), so that one runs on both engines here; the abort form
runs on the simulator alone, checked against the measurement above.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from lorapool_dev.engine.fixtures import engine_or_skip, started
from lorapool_dev.engine.server import ServeConfig
from lorapool_dev.engine.tinymodel import ensure_tiny_model
from lorapool_dev.testing.processes import RunningProcess, free_port
from lorapool_dev.testing.scrape import metric_value, scrape
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(240)]

MAX_TOKENS = 1000  # seconds of decoding on either engine: long enough to span the SIGTERM


def _post(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> tuple[int, bytes]:
    parts = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(parts[0], int(parts[1]), timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _finish_reason(raw: bytes, *, stream: bool) -> str:
    if not stream:
        return str(json.loads(raw)["choices"][0]["finish_reason"])
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
    return str(next(e["choices"][0]["finish_reason"] for e in reversed(events) if e["choices"][0]["finish_reason"]))


def _in_flight(url: str) -> tuple[dict[bool, tuple[int, bytes]], Callable[[], None]]:
    """A plain and a streamed request running on the engine; their answers fill in as they end."""
    answers: dict[bool, tuple[int, bytes]] = {}
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": MAX_TOKENS, "ignore_eos": True}

    def run(stream: bool) -> None:
        answers[stream] = _post(url, {**body, "stream": stream})

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in (False, True)]
    for t in threads:
        t.start()
    wait_until("both requests running", lambda: metric_value(scrape(url), "vllm:num_requests_running") >= 2, 60)
    return answers, lambda: [t.join(120) for t in threads] and None


def _config(shutdown_timeout: int) -> ServeConfig:
    return ServeConfig(
        model=str(ensure_tiny_model()), port=free_port(), max_model_len=2048, shutdown_timeout=shutdown_timeout
    )


@pytest.mark.parametrize("kind", ["sim", "vllm"])
def test_sigterm_with_a_drain_timeout_finishes_what_is_in_flight_and_refuses_the_rest(kind: str) -> None:
    cfg = _config(shutdown_timeout=60)
    with started(kind, cfg, install=engine_or_skip() if kind == "vllm" else None) as proc:
        answers, join = _in_flight(cfg.url)
        proc.popen.send_signal(signal.SIGTERM)
        # A request that arrives during the drain is refused at once (max_tokens 1: were it admitted
        # before the signal took effect it would end at once too, and the wait asks again).
        probe = {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}
        refused = wait_until("a new request refused", lambda: (r := _post(cfg.url, probe, 10))[0] == 500 and r, 20)
        assert b"cannot schedule new futures after shutdown" in refused[1]
        join()
        got = {stream: (status, _finish_reason(raw, stream=stream)) for stream, (status, raw) in answers.items()}
        assert got == {False: (200, "length"), True: (200, "length")}
        assert _exit_code(proc) == 0


def test_sigterm_without_a_drain_timeout_aborts_in_flight_requests_with_an_answer() -> None:
    cfg = _config(shutdown_timeout=0)
    with started("sim", cfg) as proc:
        answers, join = _in_flight(cfg.url)
        proc.popen.send_signal(signal.SIGTERM)
        join()
        got = {stream: (status, _finish_reason(raw, stream=stream)) for stream, (status, raw) in answers.items()}
        assert got == {False: (200, "abort"), True: (200, "abort")}
        assert _exit_code(proc) == 0
        with pytest.raises(ConnectionRefusedError):
            _post(cfg.url, {"model": "tiny-llama", "prompt": "x", "max_tokens": 1}, 5)


def _exit_code(proc: RunningProcess) -> int:
    return proc.popen.wait(60)
