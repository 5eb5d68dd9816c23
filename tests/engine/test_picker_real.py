"""Envoy -> the endpoint picker (lorapool router --ext-proc-port) -> real vLLM (CPU build).

One vLLM replica with two adapters preloaded; Envoy configured as the GIE protocol says
(lorapool_dev.testing.envoy, FULL_DUPLEX_STREAMED, TLS to the picker). The official openai client
talks to Envoy only: plain and streamed completions, chat, an unknown adapter's 404.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from lorapool_dev.engine.fixtures import engine_or_skip
from lorapool_dev.engine.replicas import replica_configs, start_engines, stop_engines
from lorapool_dev.engine.server import ServeConfig
from lorapool_dev.engine.tinymodel import ensure_tiny_model, write_tiny_adapter
from lorapool_dev.testing.components import start_router
from lorapool_dev.testing.envoy import GatewayConfig, bootstrap, envoy_or_skip, start_envoy
from lorapool_dev.testing.processes import ProcessError, free_ports
from lorapool_dev.testing.scrape import metric_value, scrape
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

BASE = "tiny-llama"
ADAPTERS = ("ad0", "ad1")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(Envoy's URL, the router's URL) in front of one real vLLM replica."""
    install = engine_or_skip()
    envoy_or_skip()
    root = tmp_path_factory.mktemp("adapters")
    modules = tuple((name, str(write_tiny_adapter(root / name, seed=200 + i))) for i, name in enumerate(ADAPTERS))
    template = ServeConfig(
        model=str(ensure_tiny_model(engine=install)), port=0, served_model_name=BASE,
        max_loras=2, max_lora_rank=16, max_cpu_loras=len(ADAPTERS), lora_modules=modules,
    )  # fmt: skip
    cfgs = replica_configs(template, 1)
    try:
        procs = start_engines("vllm", cfgs, install=install)
    except ProcessError as exc:
        pytest.fail(f"vllm did not start: {exc}", pytrace=False)
    try:
        picker, listen, admin = free_ports(3)
        flags = ["--poll-interval", "0.2", "--ext-proc-port", str(picker), "--ext-proc-message-timeout", "3"]
        with start_router([c.url for c in cfgs], extra=flags, health_path="/health") as router:
            cfg = GatewayConfig(listen_port=listen, picker=f"127.0.0.1:{picker}", admin_port=admin, message_timeout_s=3)
            with start_envoy(bootstrap(cfg)) as envoy:
                yield envoy.url, router.url
    finally:
        stop_engines(procs)


def test_real_vllm_through_envoy_and_the_picker(gateway: tuple[str, str]) -> None:
    url, router = gateway
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    done = api.completions.create(model="ad0", prompt="Once upon a time", max_tokens=4, temperature=0)
    assert done.model == "ad0" and done.usage is not None and done.usage.completion_tokens == 4
    chunks = list(api.completions.create(model="ad1", prompt="Once upon a time", max_tokens=5, stream=True))
    events = [c for c in chunks if c.choices]
    assert len(events) >= 2 and events[-1].choices[0].finish_reason == "length"  # relayed event by event
    chat = api.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.completions.create(model="no-such-adapter", prompt="x", max_tokens=1)
    wait_until(
        "the picker's answers counted on the router's /metrics",
        lambda: metric_value(scrape(router), "lorapool_router_requests_total", code="200") == 3,
        10,
    )
    assert metric_value(scrape(router), "lorapool_router_backend_inflight") == 0
