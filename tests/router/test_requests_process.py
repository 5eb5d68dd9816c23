"""GET /lorapool/requests on a real router in front of a real simulator, driven by the official openai client."""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from collections import Counter
from urllib.parse import urlparse

import openai
import pytest

from lorapool.api.requests import RequestWindow, decode
from lorapool.router.cli import configure, settings_from
from lorapool_dev.testing.wait import wait_until

from .conftest import BASE, StartRouter, StartSim

pytestmark = pytest.mark.timeout(120)

WINDOW_S = 2.0


def get(url: str, path: str) -> tuple[int, str, str]:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read().decode()
    finally:
        conn.close()


def last_window(url: str) -> RequestWindow | None:
    status, content_type, body = get(url, "/lorapool/requests")
    if status != 200:
        return None
    assert content_type.startswith("application/json")
    window = decode(body)
    assert window is not None, body
    return window


class Windows:
    """Every window the router serves at /lorapool/requests, read in the background from before the
    requests they count are sent.

    A request is counted in the window open when it arrives, and the endpoint serves only the last
    closed one: a read after the requests can find their window already replaced (the requests took
    longer than a window). So the reading starts first, every 50 ms, and a read that missed a whole
    window (a poll stalled for a window's length) is a failure, never an undercount."""

    def __init__(self, router: str) -> None:
        self.router = router
        self.seen: dict[float, RequestWindow] = {}
        self.missed: list[str] = []
        self._none_since: float | None = None  # wall time of the last read that found no closed window
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="request windows", daemon=True)

    def __enter__(self) -> Windows:
        self._thread.start()
        wait_until("the first read of the router's windows", lambda: self.read() or self._none_since, timeout_s=10)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _read(self) -> None:
        while not self._stop.is_set():
            asked = time.time()
            try:
                w = last_window(self.router)
            except OSError:
                w = None
            except AssertionError as exc:  # a malformed answer: the test fails with it
                with self._lock:
                    self.missed.append(f"a bad answer: {exc}")
                w = None
            else:
                if w is None and not self.seen:
                    self._none_since = asked
            if w is not None:
                with self._lock:
                    if w.end not in self.seen:
                        self._check(w)
                        self.seen[w.end] = w
            self._stop.wait(0.05)

    def _check(self, w: RequestWindow) -> None:
        if self.seen:
            last = max(self.seen)
            if w.end - last > 1.5 * w.window_s:
                self.missed.append(f"windows between {last:.2f} and {w.end:.2f}")
        elif self._none_since is not None and w.end - w.window_s > self._none_since + 0.05:
            self.missed.append(f"the first window(s), before {w.end - w.window_s:.2f}")

    def read(self) -> list[RequestWindow]:
        """The windows read so far, oldest first."""
        with self._lock:
            return [self.seen[end] for end in sorted(self.seen)]

    def until(self, until_wall_s: float, timeout_s: float = 60) -> list[RequestWindow]:
        """The windows read, oldest first, once one that closed after ``until_wall_s`` is among them."""
        read = wait_until(
            f"a window closing after {until_wall_s:.1f}",
            lambda: (read := self.read()) and read[-1].end >= until_wall_s and read,
            timeout_s=timeout_s,
            describe=lambda: [w.end for w in self.read()],
        )
        with self._lock:
            missed = list(self.missed)
        assert not missed, f"windows missed between the reads: {missed}; read: {[w.end for w in read]}"
        return read

    def counted_until(self, until_wall_s: float, timeout_s: float = 60) -> Counter[str]:
        """Every request counted by name in the windows read up to one that closed after ``until_wall_s``."""
        total: Counter[str] = Counter()
        for w in self.until(until_wall_s, timeout_s):
            total.update(w.counts)
        return total


def test_the_router_serves_its_last_closed_window_of_request_counts(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    router = start_router([start_sim(time_scale=0)], extra=["--requests-window-s", f"{WINDOW_S:g}"])
    api = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0, timeout=30)
    with Windows(router) as windows:
        for model in ("sql", "sql", "sql", "chat", "chat", BASE):
            api.completions.create(model=model, prompt="hi", max_tokens=2)
        with pytest.raises(openai.NotFoundError):
            api.completions.create(model="no-such-adapter", prompt="hi", max_tokens=1)
        # Each request was counted as it arrived, so by a window that closes after now.
        # The requests may straddle a window's end: sum every window read.
        read = windows.until(time.time())
    total: Counter[str] = Counter()
    for w in read:
        total.update(w.counts)
    assert total == {"sql": 3, "chat": 2}, read  # the base model is not counted
    assert sum(w.other for w in read) == 1, read  # the unknown name
    assert all(w.window_s == WINDOW_S for w in read)

    # With no more requests the windows close empty.
    wait_until(
        "an empty window",
        lambda: (w := last_window(router)) is not None and w.total == 0 and w.end > read[-1].end,
        timeout_s=30,
    )


def test_before_the_first_window_closes_the_endpoint_says_when_it_will(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    router = start_router([start_sim(time_scale=0)], extra=["--requests-window-s", "600"])
    status, content_type, body = get(router, "/lorapool/requests")
    assert (status, content_type.split(";")[0]) == (404, "application/json")
    assert json.loads(body) == {"error": "no window has closed yet; the first closes 600 s after start"}


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_the_window_flag_must_be_positive(value: str) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--backend", "http://127.0.0.1:1", "--requests-window-s", value])
    with pytest.raises(ValueError, match="--requests-window-s must be > 0"):
        settings_from(args)


def test_the_pod_flag_names_namespace_and_name_else_the_downward_api_does(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    backend = ["--backend", "http://127.0.0.1:1"]
    with pytest.raises(ValueError, match="expected NAMESPACE/NAME"):
        settings_from(parser.parse_args([*backend, "--pod", "just-a-name"]))
    monkeypatch.delenv("POD_NAME", raising=False)
    assert settings_from(parser.parse_args(backend)).pod is None  # not in a pod: only the endpoint
    monkeypatch.setenv("POD_NAME", "r-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    assert settings_from(parser.parse_args(backend)).pod == "ml/r-0"
    assert settings_from(parser.parse_args([*backend, "--pod", "team/r-1"])).pod == "team/r-1"
