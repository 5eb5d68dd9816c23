"""/metrics read with prometheus_client's own parser while real requests run, at real time scale."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.sim.conftest import Sim, StartSim

from lorapool.sim.timing import TimingParams

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


def samples(sim: Sim) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(sim.metrics()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(sim: Sim, name: str, **labels: str) -> float:
    return sum(v for got, v in samples(sim).get(name, []) if all(got.get(k) == x for k, x in labels.items()))


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


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
    done: list[object] = []

    def generate(model: str, tokens: int) -> None:
        done.append(
            sim.client().completions.create(
                model=model, prompt="abcd", max_tokens=tokens, extra_body={"ignore_eos": True}
            )
        )

    long_a = threading.Thread(target=generate, args=("a", 80))
    long_a.start()
    wait_for(lambda: value(sim, "vllm:num_requests_running") == 1)
    short_b = threading.Thread(target=generate, args=("b", 2))
    short_b.start()
    wait_for(lambda: value(sim, "vllm:num_requests_waiting") == 1)

    info = samples(sim)["vllm:lora_requests_info"]
    latest_labels, latest_stamp = max(info, key=lambda s: s[1])
    assert latest_labels == {"max_lora": "1", "running_lora_adapters": "a", "waiting_lora_adapters": "b"}
    assert abs(latest_stamp - time.time()) < 5  # the value is a Unix timestamp, as vLLM's
    assert value(sim, "vllm:kv_cache_usage_perc") > 0

    long_a.join(30)
    short_b.join(30)
    assert len(done) == 2
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
    assert value(sim, "vllm:num_requests_running") == 0
    final = max(samples(sim)["vllm:lora_requests_info"], key=lambda s: s[1])[0]
    assert (final["running_lora_adapters"], final["waiting_lora_adapters"]) == ("", "")


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
    wait_for(lambda: value(sim, "vllm:request_success_total", finished_reason="abort") == aborted + 1)
    assert value(sim, "vllm:num_requests_running") == 0
