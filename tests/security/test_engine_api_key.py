"""The engines' API key (spec.security.apiKeySecretRef) is sent by the router, the sidecar and,
through the gateway, set by the endpoint picker.

vLLM started with an API key refuses every /v1 route without ``Authorization: Bearer <key>``
(401); /health and /metrics stay open. The simulator has no key, so a small gate in front of
it applies vLLM's rule; router, sidecar and simulator are the real processes, given the key
the way the rendered pods get it (env VLLM_API_KEY).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import aiohttp
import openai
import pytest
from aiohttp import web

from lorapool.render.names import ENGINE_API_KEY_ENV
from lorapool_dev.testing.components import Component, router_argv, sidecar_argv, start_sim
from lorapool_dev.testing.envoy import GatewayConfig, bootstrap, envoy_or_skip, start_envoy
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import free_port, free_ports, start_process
from lorapool_dev.testing.threaded_app import serve_app
from lorapool_dev.testing.wait import wait_until

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"
KEY = "engine-secret-1"


class KeyGate:
    """vLLM's --api-key rule in front of an upstream: /v1 needs the bearer key, else 401."""

    def __init__(self, upstream: str, key: str) -> None:
        self.upstream, self.key = upstream, key
        self.url = ""
        self.accepted: list[str] = []
        self.refused: list[str] = []
        self._stack = ExitStack()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        line = f"{request.method} {request.path}"
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {self.key}":
            self.refused.append(f"{line} {request.headers.get('Authorization')!r}")
            return web.json_response({"error": "Unauthorized"}, status=401)
        if request.path.startswith("/v1"):
            self.accepted.append(line)
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        url = f"{self.upstream}{request.path_qs}"
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, url, data=body, headers=headers) as resp,
        ):
            return web.Response(body=await resp.read(), status=resp.status, content_type=resp.content_type)

    def __enter__(self) -> KeyGate:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.url = self._stack.enter_context(serve_app(app))
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()


@pytest.fixture
def gate() -> Iterator[KeyGate]:
    with start_sim(served_model_name=BASE, max_loras=2, time_scale=0, timeout_s=30) as sim, KeyGate(sim.url, KEY) as g:
        yield g


def test_the_gate_refuses_a_call_without_the_key(gate: KeyGate) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{gate.url}/v1/models", timeout=5)
    assert info.value.code == 401
    assert urllib.request.urlopen(f"{gate.url}/health", timeout=5).status == 200


def test_the_sidecar_sends_the_key_when_loading(gate: KeyGate, tmp_path: Path) -> None:
    adapter = write_peft_adapter(tmp_path / "sql", rank=8, base_model=BASE)
    config = tmp_path / "adapters.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "lorapool.io/v1alpha1",
                "kind": "AdapterSet",
                "pool": "p",
                "baseModel": BASE,
                "maxLoraRank": 16,
                "adapters": [{"name": "sql", "source": f"file://{adapter}"}],
            }
        )
    )
    port = free_port()
    argv = sidecar_argv(port, config=config, engine_url=gate.url, adapter_dir=tmp_path / "store")
    with Component(
        f"http://127.0.0.1:{port}",
        start_process(argv, f"http://127.0.0.1:{port}/healthz", 30, env={ENGINE_API_KEY_ENV: KEY}),
    ):
        wait_until("adapter loaded through the gate", lambda: "POST /v1/load_lora_adapter" in gate.accepted, 30)
    assert gate.refused == []


def test_the_router_sends_the_engines_key_not_the_clients(gate: KeyGate) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Component(
        url, start_process(router_argv(port, [gate.url]), f"{url}/livez", 60, env={ENGINE_API_KEY_ENV: KEY})
    ):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="the-clients-own-key", max_retries=0)
        wait_until("router sees the backend", lambda: client.models.list().data, 30, retry_on=(openai.APIError,))
        answer = client.completions.create(model=BASE, prompt="hello", max_tokens=4)
        assert answer.choices[0].text
    assert "POST /v1/completions" in gate.accepted
    assert gate.refused == []


@pytest.mark.envoy
def test_the_picker_sets_the_engines_key_on_what_the_gateway_sends(gate: KeyGate) -> None:
    """The gateway sends the request to the engine itself: the picker's answer sets the key over the client's."""
    envoy_or_skip()
    port, ext_proc, listen, admin = free_ports(4)
    url = f"http://127.0.0.1:{port}"
    flags = ["--ext-proc-port", str(ext_proc), "--ext-proc-insecure"]
    router = start_process(
        router_argv(port, [gate.url], extra=flags), f"{url}/livez", 60, env={ENGINE_API_KEY_ENV: KEY}
    )
    cfg = GatewayConfig(listen_port=listen, picker=f"127.0.0.1:{ext_proc}", admin_port=admin, tls=False)
    with Component(url, router), start_envoy(bootstrap(cfg)) as envoy:
        client = openai.OpenAI(base_url=f"{envoy.url}/v1", api_key="the-clients-own-key", max_retries=0)
        wait_until("the picker sees the backend", lambda: client.models.list().data, 30, retry_on=(openai.APIError,))
        answer = client.completions.create(model=BASE, prompt="hello", max_tokens=4)
        assert answer.choices[0].text
    assert "POST /v1/completions" in gate.accepted
    assert gate.refused == []
