"""``lorapool sim`` as a real process, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionMessageParam

from tests.sim.conftest import Sim, StartSim

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


@pytest.fixture(scope="module")
def sim(start_sim: StartSim, adapters: Callable[..., Path]) -> Sim:
    sql = adapters("sql", rank=8)
    return start_sim(
        "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--time-scale", "0", "--seed", "3",
        "--lora-modules", f"sql={sql}", json.dumps({"name": "sql2", "path": str(sql)}),
    )  # fmt: skip


def test_health_is_200_and_empty(sim: Sim) -> None:
    assert sim.request("GET", "/health") == (200, "")


def test_models_lists_base_and_adapter_cards(sim: Sim, adapters: Callable[..., Path]) -> None:
    cards = {card.id: card for card in sim.client().models.list().data}
    assert set(cards) == {BASE, "sql", "sql2"}
    base, sql = cards[BASE].model_dump(), cards["sql"].model_dump()
    assert (base["root"], base["parent"], base["max_model_len"], base["owned_by"]) == (BASE, None, 8192, "vllm")
    assert (sql["root"], sql["parent"], sql["object"]) == (str(adapters("sql", rank=8)), BASE, "model")


@pytest.mark.parametrize("model", [BASE, "sql"])
def test_completion(sim: Sim, model: str) -> None:
    result = sim.client().completions.create(
        model=model, prompt="Say hello to the simulator", max_tokens=7, extra_body={"ignore_eos": True}
    )
    assert result.model == model
    assert result.choices[0].finish_reason == "length"
    assert len(result.choices[0].text.split()) == 7
    assert result.usage == CompletionUsage(prompt_tokens=7, completion_tokens=7, total_tokens=14)


def test_chat_completion(sim: Sim) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    result = sim.client().chat.completions.create(
        model="sql", messages=messages, max_tokens=5, extra_body={"ignore_eos": True}
    )
    choice = result.choices[0]
    assert (choice.message.role, choice.finish_reason) == ("assistant", "length")
    assert len((choice.message.content or "").split()) == 5
    assert result.usage is not None
    assert result.usage.prompt_tokens == 1 + 4 + (5 + 2) + (5 + 2)
    assert result.object == "chat.completion"


def test_output_is_deterministic_and_depends_on_the_seed(sim: Sim) -> None:
    client = sim.client()

    def text(seed: int | None = None) -> str:
        return client.completions.create(model="sql", prompt="same prompt", max_tokens=12, seed=seed).choices[0].text

    assert text() == text()
    assert text(1) == text(1)
    assert text(1) != text(2)


def test_without_max_tokens_the_model_stops_on_its_own(sim: Sim) -> None:
    result = sim.client().chat.completions.create(model=BASE, messages=[{"role": "user", "content": "tell me"}])
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None
    assert 8 <= result.usage.completion_tokens <= 512


def test_streaming_completion_with_usage(sim: Sim) -> None:
    stream = sim.client().completions.create(
        model="sql",
        prompt="stream me",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks).count(" ") == 6
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_streaming_chat_matches_non_streaming(sim: Sim) -> None:
    client = sim.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "the same question"}]
    whole = client.chat.completions.create(model="sql", messages=messages, max_tokens=9).choices[0].message.content
    chunks = list(client.chat.completions.create(model="sql", messages=messages, max_tokens=9, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason is not None
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_sse_wire_format(sim: Sim) -> None:
    status, body = sim.request(
        "POST", "/v1/completions", {"model": "sql", "prompt": "x", "max_tokens": 3, "stream": True}
    )
    assert status == 200
    events = body.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert json.loads(events[0][len("data: ") :])["object"] == "text_completion"


def test_unknown_model_is_vllm_404(sim: Sim) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sim.client().completions.create(model="nope", prompt="x")
    assert caught.value.status_code == 404
    status, body = sim.post("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert (status, body) == (
        404,
        {
            "error": {
                "message": "The model `nope` does not exist. Valid aliases: meta-llama/Meta-Llama-3-8B-Instruct.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        },
    )


@pytest.mark.parametrize(
    ("body", "content_type", "err_type", "param"),
    [
        # FastAPI's own validation errors are type "Bad Request" in vLLM 0.32 (tests/conformance).
        pytest.param(b"{not json", "application/json", "Bad Request", "body.1", id="invalid-json"),
        pytest.param({"model": "sql"}, "application/json", "BadRequestError", "prompt", id="missing-prompt"),
        pytest.param(
            {"prompt": "x", "max_tokens": -1},
            "application/json",
            "BadRequestError",
            "max_tokens",
            id="negative-max-tokens",
        ),
        pytest.param(
            {"prompt": "x", "max_tokens": 9000}, "application/json", "BadRequestError", "max_tokens", id="over-context"
        ),
        pytest.param({"prompt": "x"}, "text/plain", "Bad Request", None, id="not-json-content-type"),
    ],
)
def test_bad_body_is_400_with_vllm_error_shape(
    sim: Sim, body: object, content_type: str, err_type: str, param: str | None
) -> None:
    status, text = sim.request("POST", "/v1/completions", body, content_type=content_type)
    error = json.loads(text)["error"]
    assert (status, error["code"], error["type"], error["param"]) == (400, 400, err_type, param)
    assert error["message"]


def test_unknown_paths_answer_like_fastapi(sim: Sim) -> None:
    assert sim.request("GET", "/v2/nothing") == (404, '{"detail":"Not Found"}')
    assert sim.request("POST", "/v1/models", {})[0] == 405
