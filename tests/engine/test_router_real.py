"""The router in front of two real vLLM (CPU) replicas, with the affinity policy reading their metrics.

Two vLLM processes (one per core, ``--max-loras 2``, six adapters preloaded with
``--lora-modules``) and one ``lorapool router --policy affinity`` serve the whole module. The
clients are the official ``openai`` client; the router adds ``X-Lorapool-Backend`` so a test can
see where a request went.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
import pytest

from lorapool_dev.engine.fixtures import engine_or_skip
from lorapool_dev.engine.replicas import replica_configs, start_engines, stop_engines
from lorapool_dev.engine.server import ServeConfig
from lorapool_dev.engine.tinymodel import ensure_tiny_model, write_tiny_adapter
from lorapool_dev.testing.components import Component, start_router
from lorapool_dev.testing.processes import ProcessError
from lorapool_dev.testing.scrape import samples
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.engine

BASE = "tiny-llama"
ADAPTERS = tuple(f"ad{i}" for i in range(6))  # 6 adapters > 2 replicas x 2 slots
PROMPT = "Once upon a time"
LONG_TOKENS = 480  # a foreign request that keeps its adapter running for seconds (max-model-len 512)


@dataclass
class Pool:
    replicas: list[str]  # base URLs
    router: Component

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def router_gauge(self, name: str) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.router.url}/metrics", timeout=10) as resp:
            page = resp.read().decode()
        return {labels.get("backend", ""): value for labels, value in samples(page).get(name, [])}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    install = engine_or_skip()
    root = tmp_path_factory.mktemp("adapters")
    modules = tuple((name, str(write_tiny_adapter(root / name, seed=100 + i))) for i, name in enumerate(ADAPTERS))
    template = ServeConfig(
        model=str(ensure_tiny_model(engine=install)), port=0, served_model_name=BASE,
        max_loras=2, max_lora_rank=16, max_cpu_loras=len(ADAPTERS), lora_modules=modules,
    )  # fmt: skip
    cfgs = replica_configs(template, 2)
    try:
        procs = start_engines("vllm", cfgs, install=install)
    except ProcessError as exc:
        pytest.fail(f"vllm did not start: {exc}", pytrace=False)
    try:
        urls = [cfg.url for cfg in cfgs]
        extra = ["--poll-interval", "0.2", "--backend-header", "--max-loras", "2", "--load-slack", "2"]
        with start_router(urls, policy="affinity", extra=extra, health_path="/health") as router:
            yield Pool(urls, router)
    finally:
        stop_engines(procs)


def _direct(url: str, model: str) -> str:
    """A temperature-0 completion straight from one replica (no router)."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["choices"][0]["text"])


def test_every_request_is_answered_across_both_replicas_with_more_adapters_than_slots(pool: Pool) -> None:
    expected = {m: _direct(pool.replicas[0], m) for m in (BASE, *ADAPTERS)}
    assert len(set(expected.values())) == len(expected)  # each adapter answers differently
    assert all(_direct(pool.replicas[1], m) == expected[m] for m in expected)  # the replicas are the same model
    client = pool.client()

    def ask(model: str) -> tuple[str, str, str]:
        raw = client.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=6, temperature=0)
        answer = raw.parse()
        return model, answer.choices[0].text, raw.headers["X-Lorapool-Backend"]

    # Adapters only: vLLM 0.32's CPU LoRA ops apply the last slot's adapter to base-model
    # requests batched beside LoRA ones (index -1 taken as a Python index; vllm-project/vllm
    # PR #48421), so base-model answers change under mixed load on the CPU engine.
    models = [m for _ in range(4) for m in ADAPTERS]  # 24 requests, 6 adapters, at once
    with ThreadPoolExecutor(max_workers=12) as workers:
        answers = list(workers.map(ask, models))
    assert len(answers) == len(models)
    assert [(m, text) for m, text, _ in answers if text != expected[m]] == []
    assert {backend for _, _, backend in answers} == set(pool.replicas)
    assert pool.router_gauge("lorapool_router_backend_up") == {url: 1.0 for url in pool.replicas}
    with pytest.raises(openai.NotFoundError, match="no-such-adapter"):  # a clear error, not a hang
        client.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=2)


def test_affinity_reads_the_replicas_real_lora_metrics(pool: Pool) -> None:
    """Foreign requests (sent to replica 0, not through the router) fill its two LoRA slots; the
    router sees them in vLLM's own ``vllm:lora_requests_info``, sends a request for one of those
    adapters to replica 0 (affinity) and one for a third adapter to replica 1 (no free slot on 0)."""
    first, second = pool.replicas
    streams = [_ForeignStream(first, "ad0"), _ForeignStream(first, "ad1")]
    for stream in streams:
        stream.start()
    try:
        wait_until(
            "the router to see two adapters active on replica 0 (from its /metrics)",
            lambda: pool.router_gauge("lorapool_router_backend_active_adapters").get(first) == 2.0,
            60,
            describe=lambda: (
                pool.router_gauge("lorapool_router_backend_active_adapters"),
                [s.tokens for s in streams],
            ),
        )
        client = pool.client()
        same = client.completions.with_raw_response.create(model="ad0", prompt=PROMPT, max_tokens=2)
        other = client.completions.with_raw_response.create(model="ad2", prompt=PROMPT, max_tokens=2)
        still_running = all(s.alive() for s in streams)
    finally:
        for stream in streams:
            stream.join()
    assert still_running, "the foreign requests ended before the routed ones were placed; raise LONG_TOKENS"
    assert [s.error for s in streams] == [None, None]
    assert same.headers["X-Lorapool-Backend"] == first, "affinity: ad0 is running on replica 0"
    assert other.headers["X-Lorapool-Backend"] == second, "replica 0's two LoRA slots are taken by ad0 and ad1"
    assert same.parse().model == "ad0" and other.parse().model == "ad2"


class _ForeignStream:
    """A long streamed completion sent straight to a replica, read to the end in a thread."""

    def __init__(self, url: str, model: str) -> None:
        body = {
            "model": model, "prompt": PROMPT, "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True,
            "temperature": 0,
        }  # fmt: skip
        self.request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        self.tokens = 0
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            with urllib.request.urlopen(self.request, timeout=300) as resp:
                for line in resp:
                    if line.startswith(b"data: {"):
                        self.tokens += 1
        except OSError as exc:
            self.error = repr(exc)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self) -> None:
        self.thread.join(timeout=300)
        assert not self.thread.is_alive(), "a foreign stream did not end"
