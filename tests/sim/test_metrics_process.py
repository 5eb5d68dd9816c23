"""/metrics read with prometheus_client's own parser while real requests run, at real time scale."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lorapool.sim.timing import TimingParams
from lorapool_dev.testing.scrape import Samples, latest_labels, metric_value
from lorapool_dev.testing.scrape import samples as parse_samples
from lorapool_dev.testing.wait import wait_until
from tests.sim.conftest import Sim, StartSim

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


def samples(sim: Sim) -> Samples:
    return parse_samples(sim.metrics())


def value(sim: Sim, name: str, **labels: str) -> float:
    return metric_value(sim.metrics(), name, **labels)


@pytest.fixture(scope="module")
def sim(start_sim: StartSim, adapters: Callable[..., Path]) -> Sim:
    a, b = adapters("m-a", rank=8), adapters("m-b", rank=8, seed=1)
    return start_sim(
        "--enable-lora", "--max-loras", "1", "--max-cpu-loras", "2", "--time-scale", "1",
        "--lora-modules", f"a={a}", f"b={b}",
    )  # fmt: skip


def test_metric_names_and_labels_are_vllms(sim: Sim) -> None:
    got = samples(sim)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_cached_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert got[name][0][0] == {"model_name": BASE, "engine": "0"}, name
    assert {labels["finished_reason"] for labels, _ in got["vllm:request_success_total"]} == {"stop", "length", "abort"}
    assert {labels["from"] for labels, _ in got["sim:lora_loads_total"]} == {"cpu", "disk"}
    for name in ("sim:lora_load_stall_seconds_total", "sim:schedule_overrun_seconds_total", "sim:time_scale"):
        assert name in got, name


def test_lora_requests_info_and_counts_while_requests_run(sim: Sim) -> None:
    before = samples(sim)

    def generate(model: str, tokens: int) -> object:
        return sim.client().completions.create(
            model=model, prompt="abcd", max_tokens=tokens, extra_body={"ignore_eos": True}
        )

    def a_running_b_waiting() -> tuple[dict[str, str], float, float] | None:
        page = sim.metrics()  # one page: labels, stamp and KV usage of the same instant
        info = parse_samples(page).get("vllm:lora_requests_info", [])
        if not info:
            return None
        labels, stamp = max(info, key=lambda s: s[1])
        # vLLM 0.32/0.34 list the running batch's adapters in both labels; b, only waiting, in neither.
        if (labels["running_lora_adapters"], labels["waiting_lora_adapters"]) != ("a", "a"):
            return None
        if (metric_value(page, "vllm:num_requests_running"), metric_value(page, "vllm:num_requests_waiting")) != (1, 1):
            return None
        return labels, stamp, metric_value(page, "vllm:kv_cache_usage_perc")

    # The pool waits for every request, even when an assertion fails first: no thread of this
    # test outlives it (a stray client thread would fail a later test when the sim stops).
    with ThreadPoolExecutor(max_workers=2) as pool:
        long_a = pool.submit(generate, "a", 80)
        wait_until("a running", lambda: value(sim, "vllm:num_requests_running") == 1, 10)
        short_b = pool.submit(generate, "b", 2)
        # lora_requests_info is stamped after each engine step, so it is polled, not sampled once
        labels, stamp, kv_usage = wait_until(
            "lora_requests_info: a running, b waiting", a_running_b_waiting, 10, describe=sim.metrics
        )
        assert labels == {"max_lora": "1", "running_lora_adapters": "a", "waiting_lora_adapters": "a"}
        assert abs(stamp - time.time()) < 5  # the value is a Unix timestamp, as vLLM's
        assert kv_usage > 0
        assert long_a.result(30) and short_b.result(30)
    after = samples(sim)

    def delta(name: str, **labels: str) -> float:
        def pick(s: dict[str, list[tuple[dict[str, str], float]]]) -> float:
            return sum(v for got, v in s.get(name, []) if all(got.get(k) == x for k, x in labels.items()))

        return pick(after) - pick(before)

    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:generation_tokens_total") == 82
    assert delta("vllm:prompt_tokens_total") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    # one GPU slot: b then a again each came from the CPU cache, and each stalled a step
    assert delta("sim:lora_loads_total", **{"from": "cpu"}) == 2
    assert delta("sim:lora_load_stall_seconds_total") == pytest.approx(2 * TimingParams().gpu_load_s(8))
    # b waited behind a whole 80-token request: the admission rule, visible in its latency
    e2e_sum = delta("vllm:e2e_request_latency_seconds_sum")
    assert e2e_sum > 2 * 80 * TimingParams().decode_step_s(1) * 0.9
    wait_until("no request running", lambda: value(sim, "vllm:num_requests_running") == 0, 10)

    def idle_info() -> bool:
        final = latest_labels(sim.metrics(), "vllm:lora_requests_info") or {}
        return (final.get("running_lora_adapters"), final.get("waiting_lora_adapters")) == ("", "")

    wait_until("lora_requests_info with nothing running or waiting", idle_info, 10, describe=sim.metrics)


def test_a_cold_load_takes_simulated_disk_time(sim: Sim, adapters: Callable[..., Path]) -> None:
    path = adapters("m-cold", rank=8, seed=5)
    started = time.monotonic()
    status, _ = sim.post("/v1/load_lora_adapter", {"lora_name": "cold", "lora_path": str(path)})
    elapsed = time.monotonic() - started
    assert status == 200
    timing = TimingParams()
    assert elapsed >= 0.9 * (timing.disk_load_s(8, cold=True) + timing.gpu_load_s(8))


def test_client_disconnect_aborts_the_request(sim: Sim) -> None:
    aborted = value(sim, "vllm:request_success_total", finished_reason="abort")
    host, port = sim.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    body = {"model": "a", "prompt": "abcd", "max_tokens": 500, "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    conn.close()

    def aborted_and_idle() -> bool:
        page = sim.metrics()
        return (
            metric_value(page, "vllm:request_success_total", finished_reason="abort") == aborted + 1
            and metric_value(page, "vllm:num_requests_running") == 0
        )

    wait_until("the request aborted and nothing running", aborted_and_idle, 10, describe=sim.metrics)
