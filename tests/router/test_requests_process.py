"""GET /lorapool/requests on a real router in front of a real simulator, driven by the official openai client."""

from __future__ import annotations

import argparse
import http.client
import json
from collections import Counter
from itertools import pairwise
from urllib.parse import urlparse

import openai
import pytest

from lorapool.api.requests import RequestWindow, decode
from lorapool.router.cli import configure, settings_from
from lorapool.testing.wait import wait_until

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


def counted_until(router: str, until_wall_s: float, timeout_s: float = 60) -> Counter[str]:
    """Every request the router counted by name in the windows up to the first that closed after
    ``until_wall_s``, summed; the windows read must follow each other without a gap (a poll that
    missed a whole window fails here rather than undercount)."""
    seen: dict[float, RequestWindow] = {}

    def done() -> bool:
        if (w := last_window(router)) is not None:
            seen[w.end] = w
        return bool(seen) and max(seen) >= until_wall_s

    wait_until(f"a window closing after {until_wall_s:.1f}", done, timeout_s=timeout_s, max_interval_s=0.1)
    ends = sorted(seen)
    gaps = [b - a for a, b in pairwise(ends) if b - a > 1.5 * seen[b].window_s]
    assert not gaps, f"windows missed between the polls: {ends}"
    total: Counter[str] = Counter()
    for w in seen.values():
        total.update(w.counts)
    return total


def test_the_router_serves_its_last_closed_window_of_request_counts(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    router = start_router([start_sim(time_scale=0)], extra=["--requests-window-s", f"{WINDOW_S:g}"])
    api = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0, timeout=30)
    for model in ("sql", "sql", "sql", "chat", "chat", BASE):
        api.completions.create(model=model, prompt="hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="no-such-adapter", prompt="hi", max_tokens=1)

    # The requests may straddle a window's end: sum every distinct window (by its end) until all are seen.
    seen: dict[float, RequestWindow] = {}

    def all_counted() -> dict[float, RequestWindow] | None:
        if (w := last_window(router)) is not None:
            seen[w.end] = w
        total: Counter[str] = Counter()
        for w in seen.values():
            total.update(w.counts)
        other = sum(w.other for w in seen.values())
        return seen if total == {"sql": 3, "chat": 2} and other == 1 else None

    windows = wait_until(
        "the router's windows to count 3 sql, 2 chat and 1 unknown name",
        all_counted,
        timeout_s=30,
        max_interval_s=0.1,
        describe=lambda: seen,
    )
    assert all(w.window_s == WINDOW_S for w in windows.values())
    assert BASE not in set().union(*(w.counts for w in windows.values()))

    # With no more requests the windows close empty.
    wait_until(
        "an empty window",
        lambda: (w := last_window(router)) is not None and w.total == 0 and w.end > max(windows),
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
