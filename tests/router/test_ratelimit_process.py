"""Rate limits through the router process: the official openai client and raw HTTP against real
simulators, limits read from ``--traffic-file`` as the operator writes it, and re-read live."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from lorapool.api.traffic import AdapterTraffic, RateLimits, TrafficPolicy
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.scrape import metric_value as metric
from lorapool_dev.testing.scrape import scrape
from lorapool_dev.testing.wait import wait_until

from .conftest import StartRouter, StartSim
from .test_router_process import client, post

pytestmark = pytest.mark.timeout(120)


def write(path: Path, routers: int = 1, **adapters: RateLimits) -> Path:
    policy = TrafficPolicy(
        pool="test", routers=routers, adapters={m: AdapterTraffic(limits=lim) for m, lim in adapters.items()}
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(policy.to_json())
    tmp.replace(path)  # whole, as the kubelet's symlink flip: never a half-written file
    return path


def completion(model: str, **extra: object) -> bytes:
    return json.dumps({"model": model, "prompt": "x" * 400, "max_tokens": 2, **extra}).encode()


def test_a_burst_passes_then_429_with_retry_after_and_ratelimit_headers(
    start_sim: StartSim, start_router: StartRouter, tmp_path: Path
) -> None:
    # 1 request every 100 s after a burst of 3: the test cannot refill it by being slow.
    limits = write(tmp_path / "traffic.json", sql=RateLimits(requests_per_second=0.01, burst_requests=3))
    router = start_router([start_sim(time_scale=0)], extra=["--traffic-file", str(limits)])
    answers = [post(router, completion("sql")) for _ in range(5)]
    assert [status for status, _, _ in answers] == [200, 200, 200, 429, 429]
    _, ok_headers, _ = answers[0]
    assert ok_headers["x-ratelimit-limit-requests"] == "3" and ok_headers["x-ratelimit-remaining-requests"] == "2"
    _, headers, body = answers[3]
    assert int(headers["Retry-After"]) >= 90 and headers["x-ratelimit-remaining-requests"] == "0"
    error = json.loads(body)["error"]
    assert error["type"] == "RateLimitError" and "'sql'" in error["message"]
    # other adapters are not limited, and the official client sees a RateLimitError
    assert post(router, completion("chat"))[0] == 200
    with pytest.raises(openai.RateLimitError, match="over its rate limit"):
        client(router).completions.create(model="sql", prompt="x", max_tokens=1)
    page = scrape(router)
    assert metric(page, "lorapool_router_adapter_throttled_total", adapter="sql", limit="requests") == 3
    assert metric(page, "lorapool_router_requests_total", model="sql", code="429") == 3


def test_a_token_limit_counts_the_real_usage_of_a_stream(
    start_sim: StartSim, start_router: StartRouter, tmp_path: Path
) -> None:
    limits = write(tmp_path / "traffic.json", sql=RateLimits(tokens_per_minute=1, burst_tokens=300))
    router = start_router([start_sim(time_scale=0)], extra=["--traffic-file", str(limits)])
    # ~100 prompt tokens charged up front; the stream's ~250 generated ones settle at its end
    streamed = client(router).completions.create(
        model="sql", prompt="x" * 400, max_tokens=250, stream=True, extra_body={"ignore_eos": True}
    )
    assert sum(1 for c in streamed if c.choices and c.choices[0].text) == 250
    # The client stops at [DONE]; the router settles as the response ends, then counts the answer.
    answered = lambda: metric(scrape(router), "lorapool_router_requests_total", model="sql", code="200") == 1  # noqa: E731
    wait_until("the stream answered and settled", answered, 10)
    status, headers, _ = post(router, completion("sql"))
    assert status == 429 and headers["x-ratelimit-limit-tokens"] == "300", headers
    page = scrape(router)
    assert metric(page, "lorapool_router_adapter_throttled_total", adapter="sql", limit="tokens") == 1


def test_a_changed_file_applies_live_and_a_broken_one_keeps_the_last_good(
    start_sim: StartSim, start_router: StartRouter, tmp_path: Path
) -> None:
    path = write(tmp_path / "traffic.json")
    router = start_router([start_sim(time_scale=0)], extra=["--traffic-file", str(path)])
    assert post(router, completion("code"))[0] == 200
    write(path, code=RateLimits(requests_per_second=0.01, burst_requests=1))

    def limited() -> bool:  # each try spends the one request the burst allows
        return post(router, completion("code"))[0] == 429

    wait_until("the new limit applies", limited, 20)
    path.write_text('{"adapters": {"code": {"priority": "urgent"}}}')  # a hand edit gone wrong

    def refused() -> bool:
        return metric(scrape(router), "lorapool_router_traffic_reloads_total", result="refused") == 1

    wait_until("the broken file was read and refused", refused, 20)
    for _ in range(3):
        assert post(router, completion("code"))[0] == 429  # the last good limit still holds
    assert metric(scrape(router), "lorapool_router_traffic_reloads_total", result="applied") == 1


def test_a_bad_file_at_start_stops_the_router_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "traffic.json"
    bad.write_text('{"adapters": {"sql": {"limits": {"burstRequests": 5}}}}')
    port = free_port()
    argv = [sys.executable, "-m", "lorapool.cli", "router", "--port", str(port), "--backend",
            f"http://127.0.0.1:{free_port()}", "--traffic-file", str(bad)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert "--traffic-file" in result.stderr and "adapters.sql.limits" in result.stderr
    assert "requestsPerSecond or tokensPerMinute" in result.stderr
    assert "Traceback" not in result.stderr


def test_three_router_processes_admit_the_pools_limit_not_three_times_it(
    start_sim: StartSim, start_router: StartRouter, tmp_path: Path
) -> None:
    """Over-admission measured with three real routers sharing one traffic file (routers: 3), as a
    Service spreads a client's requests: the pool's burst passes, and no more."""
    limits = write(tmp_path / "traffic.json", routers=3, sql=RateLimits(requests_per_second=0.01, burst_requests=9))
    sim = start_sim(time_scale=0)
    routers = [start_router([sim], extra=["--traffic-file", str(limits)]) for _ in range(3)]
    answers = [post(routers[i % 3], completion("sql"))[0] for i in range(30)]
    assert answers.count(200) == 9  # 3 per router: the pool's burst of 9, not 27
    assert answers.count(429) == 21
    # a client stuck on one router gets that router's share only (docs/traffic.md says so)
    assert post(routers[0], completion("sql"))[0] == 429
