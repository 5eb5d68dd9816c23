"""The conformance table: the same cases against real vLLM (CPU, 0.32) and ``lorapool sim``.

Real vLLM is the reference: every expectation below is what vLLM 0.32 (CPU) answers. A case
the simulator answers differently on purpose carries ``sim=`` (what the simulator does instead)
and ``why=``; each such case is a row of the tolerance table in ``operator/lorapool/sim/README.md``
(a test below checks the table lists them). What is compared: status codes, error types and
params, the words of messages a client reads, JSON key sets and metric names/labels; never the
generated text (the tiny model talks nonsense, the simulator talks other nonsense).
"""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lorapool.api.vllm_versions import CPU_TIER
from lorapool.errors import AdapterError
from lorapool.sim.metrics import LATENCY_BUCKETS, TTFT_BUCKETS
from lorapool.sources.verify import BaseShape, verify_adapter_dir
from lorapool_dev.engine.tinymodel import DEFAULT_SPEC, llama_config
from lorapool_dev.testing.scrape import latest_labels, metric_value, samples
from lorapool_dev.testing.wait import wait_until
from tests.conformance.conftest import BASE, BLOCK_SIZE, MAX_LORA_RANK, MAX_LORAS, MAX_MODEL_LEN, Engine, Response

SIM_README = Path(__file__).resolve().parents[2] / "operator" / "lorapool" / "sim" / "README.md"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@dataclass(frozen=True)
class Expect:
    """What a response must be: status; for errors vLLM's ``type``/``param``; words in the body."""

    status: int
    err_type: str | None = None
    param: str | None = "<any>"
    says: tuple[str, ...] = ()
    body: str | None = None  # the exact body (success texts, FastAPI's detail bodies)


@dataclass(frozen=True)
class Case:
    id: str
    path: str
    body: Any = None  # dict -> JSON; bytes -> raw
    method: str = "POST"
    content_type: str = "application/json"
    setup: tuple[tuple[str, dict[str, Any]], ...] = ()  # POSTs that must answer 200 first
    expect: Expect = field(default_factory=lambda: Expect(200))
    sim: Expect | None = None  # the simulator's answer when it differs on purpose
    why: str = ""


def load(name: str, path: str, inplace: bool | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"lora_name": name, "lora_path": path}
    if inplace is not None:
        body["load_inplace"] = inplace
    return body


def _internal(reason: str) -> Expect:
    """vLLM 0.32 wraps every failure of the worker's add_lora in a 500."""
    return Expect(
        500, "InternalServerError", None, ("Call to add_lora method failed: Worker failed with error", reason)
    )


# Adapter paths are written as "@name" and resolved per engine.
CASES: tuple[Case, ...] = (
    Case(
        "load",
        LOAD,
        load("load", "@good-a"),
        expect=Expect(200, body="Success: LoRA adapter 'load' added successfully."),
    ),
    Case(
        "load-duplicate",
        LOAD,
        load("dup", "@good-a"),
        setup=((LOAD, load("dup", "@good-a")),),
        expect=Expect(
            400, "InvalidUserInput", None, ("The lora adapter 'dup' has already been loaded.", "load_inplace")
        ),
    ),
    Case(
        "load-inplace",
        LOAD,
        load("inplace", "@good-b", inplace=True),
        setup=((LOAD, load("inplace", "@good-a")),),
        expect=Expect(200, body="Success: LoRA adapter 'inplace' added successfully."),
    ),
    Case(
        "load-missing-path",
        LOAD,
        load("missing", "@missing"),
        expect=Expect(
            404, "NotFoundError", None, body=None, says=("Loading lora missing failed: No adapter found for <path>",)
        ),
    ),
    Case(
        "load-rank-too-high",
        LOAD,
        load("big", "@rank-64"),
        expect=_internal(f"LoRA rank 64 is greater than max_lora_rank {MAX_LORA_RANK}."),
    ),
    Case("load-dora", LOAD, load("dora", "@dora"), expect=_internal("vLLM does not yet support DoRA.")),
    Case(
        "load-modules-to-save",
        LOAD,
        load("saved", "@modules-to-save"),
        expect=_internal("Unsupported modules_to_save: ['lm_head']"),
    ),
    Case("load-corrupt", LOAD, load("corrupt", "@corrupt"), expect=_internal("")),
    # Adapters that do not fit the model. vLLM loads all but one and serves them wrongly; the simulator
    # refuses them through lorapool.sources.verify, as the sidecar does before any load (test_verified_*).
    Case(
        "load-wrong-base",
        LOAD,
        load("wrong-base", "@wrong-base"),
        expect=Expect(200, body="Success: LoRA adapter 'wrong-base' added successfully."),
        sim=_internal(f"{BASE} expects [8, 512] (r x intermediate_size 512)"),
        why="vLLM copies the smaller tensors into its buffers and serves them; the verifier refuses the shapes",
    ),
    Case(
        "load-other-prefix",
        LOAD,
        load("other-prefix", "@other-prefix"),
        expect=Expect(200, body="Success: LoRA adapter 'other-prefix' added successfully."),
        sim=_internal("which is not in the base; vLLM would ignore it without a word"),
        why="vLLM matches no module and serves base-model output (vllm#34186); the verifier refuses the names",
    ),
    Case(
        "load-too-many-layers",
        LOAD,
        load("too-many-layers", "@too-many-layers"),
        expect=Expect(200, body="Success: LoRA adapter 'too-many-layers' added successfully."),
        sim=_internal(f"is for layer 2, but {BASE} has 2 layers (0..1)"),
        why="vLLM ignores the layers the model lacks and serves the rest; the verifier refuses the adapter",
    ),
    Case(
        "load-rank-mismatch",
        LOAD,
        load("rank-mismatch", "@rank-mismatch"),
        expect=Expect(200, body="Success: LoRA adapter 'rank-mismatch' added successfully."),
        sim=_internal("has rank 16 (shape [16, 512]), but adapter_config.json says r=8 for it"),
        why="vLLM takes the rank from the config (scaling alpha/r) and the weights as they are; the verifier refuses",
    ),
    Case(
        "load-module-base-lacks",
        LOAD,
        load("module-base-lacks", "@module-base-lacks"),
        expect=_internal("expected target modules in"),
    ),
    # vLLM's worker fails on it with an empty reason; the simulator's 500 gives the verifier's.
    Case("load-no-lora-tensors", LOAD, load("no-lora-tensors", "@no-lora-tensors"), expect=_internal("")),
    Case(
        "load-no-path",
        LOAD,
        {"lora_name": "x"},
        expect=Expect(400, "Bad Request", "body.lora_path", ("Field required",)),
    ),
    Case(
        "load-empty-fields",
        LOAD,
        {"lora_name": "", "lora_path": ""},
        expect=Expect(400, "InvalidUserInput", None, ("Both 'lora_name' and 'lora_path' must be provided.",)),
    ),
    Case(
        "unload",
        UNLOAD,
        {"lora_name": "gone"},
        setup=((LOAD, load("gone", "@good-a")),),
        expect=Expect(200, body="Success: LoRA adapter 'gone' removed successfully."),
    ),
    Case(
        "unload-unknown",
        UNLOAD,
        {"lora_name": "nope"},
        expect=Expect(404, "NotFoundError", None, ("The lora adapter 'nope' cannot be found.",)),
    ),
    Case("unload-no-name", UNLOAD, {}, expect=Expect(400, "Bad Request", "body.lora_name", ("Field required",))),
    Case(
        "unknown-model",
        COMPLETIONS,
        {"model": "nope", "prompt": "Hi", "max_tokens": 2},
        expect=Expect(404, "NotFoundError", "model", (f"The model `nope` does not exist. Valid aliases: {BASE}.",)),
    ),
    Case(
        "unloaded-adapter",
        COMPLETIONS,
        {"model": "dropped", "prompt": "Hi", "max_tokens": 2},
        setup=((LOAD, load("dropped", "@good-a")), (UNLOAD, {"lora_name": "dropped"})),
        expect=Expect(404, "NotFoundError", "model", ("The model `dropped` does not exist.",)),
    ),
    Case(
        "max-tokens-over-context",
        COMPLETIONS,
        {"model": BASE, "prompt": "Hi", "max_tokens": MAX_MODEL_LEN + 88},
        expect=Expect(
            400,
            "BadRequestError",
            "max_tokens",
            (f"max_tokens={MAX_MODEL_LEN + 88} cannot be greater than max_model_len={MAX_MODEL_LEN}.",),
        ),
    ),
    Case(
        "prompt-plus-max-tokens-over-context",  # vLLM 0.32 caps the output instead of refusing
        COMPLETIONS,
        {"model": BASE, "prompt": [1] * 8, "max_tokens": MAX_MODEL_LEN - 1, "ignore_eos": True},
        expect=Expect(200),
    ),
    Case(
        "prompt-over-context",
        COMPLETIONS,
        {"model": BASE, "prompt": [1] * (MAX_MODEL_LEN + 1), "max_tokens": 2},
        expect=Expect(400, "BadRequestError", "input_tokens", (f"maximum context length is {MAX_MODEL_LEN} tokens",)),
    ),
    Case(
        "max-tokens-zero",
        COMPLETIONS,
        {"model": BASE, "prompt": "Hi", "max_tokens": 0},
        expect=Expect(400, "BadRequestError", "max_tokens"),
    ),
    Case(
        "stream-options-without-stream",
        COMPLETIONS,
        {"model": BASE, "prompt": "Hi", "stream_options": {"include_usage": True}},
        expect=Expect(
            400, "BadRequestError", "stream_options", ("Stream options can only be defined when `stream=True`.",)
        ),
    ),
    Case(
        "bad-json",
        COMPLETIONS,
        b'{"model": "tiny-llama", "prompt": ',
        expect=Expect(400, "Bad Request", "<any>", ("JSON decode error",)),
    ),
    Case(
        "not-json-content-type",
        COMPLETIONS,
        b'{"model": "tiny-llama", "prompt": "Hi"}',
        content_type="text/plain",
        expect=Expect(400, "Bad Request", None, ("Unsupported Media Type: Only 'application/json' is allowed",)),
    ),
    Case("body-not-object", COMPLETIONS, [1], expect=Expect(400, "Bad Request", "body")),
    Case("chat-no-messages", CHAT, {"model": BASE, "messages": []}, expect=Expect(400, "BadRequestError", None)),
    Case("n-2", COMPLETIONS, {"model": BASE, "prompt": "Hi", "max_tokens": 3, "n": 2}, expect=Expect(200)),
    Case(
        "prompt-missing",
        COMPLETIONS,
        {"model": BASE, "max_tokens": 2},
        expect=Expect(400, "BadRequestError", "prompt", ("Either prompt or prompt_embeds must be provided",)),
    ),
    Case(
        "model-not-string", COMPLETIONS, {"model": 3, "prompt": "Hi"}, expect=Expect(400, "Bad Request", "body.model")
    ),
    Case("max-tokens-as-string", COMPLETIONS, {"model": BASE, "prompt": "Hi", "max_tokens": "3"}, expect=Expect(200)),
    Case(
        "stream-as-string",
        COMPLETIONS,
        {"model": BASE, "prompt": "Hi", "max_tokens": 2, "stream": "yes"},
        expect=Expect(200),
    ),
    Case(
        "n-zero",
        COMPLETIONS,
        {"model": BASE, "prompt": "Hi", "n": 0},
        expect=Expect(400, "BadRequestError", None, ("n must be at least 1, got 0.",)),
    ),
    Case(
        "chat-messages-not-list",
        CHAT,
        {"model": BASE, "messages": "hi"},
        expect=Expect(400, "Bad Request", "body.messages"),
    ),
    Case(
        "chat-message-without-role",
        CHAT,
        {"model": BASE, "messages": [{"content": "x"}]},
        expect=Expect(400, "Bad Request", "body.messages.0.ChatCompletionDeveloperMessageParam.role"),
        sim=Expect(400, "Bad Request", "body.messages"),
        why="pydantic reports the first member of the message-type union; the simulator names the list",
    ),
    Case(
        "batch-prompts",
        COMPLETIONS,
        {"model": BASE, "prompt": ["Hi", "there"], "max_tokens": 2},
        expect=Expect(200),
        sim=Expect(400, "BadRequestError", "prompt", ("one prompt per request",)),
        why="nothing of ours sends a batch of prompts; the simulator refuses it plainly",
    ),
    Case(
        "n-2-stream",
        COMPLETIONS,
        {"model": BASE, "prompt": "Hi", "max_tokens": 2, "n": 2, "stream": True},
        expect=Expect(200),
        sim=Expect(400, "BadRequestError", "n", ("streams n=1 only",)),
        why="nothing of ours streams n > 1; n > 1 without streaming is served",
    ),
    Case(
        "load-base-name",
        LOAD,
        load(BASE, "@good-a"),
        expect=Expect(
            400, "InvalidUserInput", None, (f"The lora adapter '{BASE}' conflicts with a served base model.",)
        ),
    ),
    Case("load-inplace-as-string", LOAD, {**load("lax", "@good-a"), "load_inplace": "yes"}, expect=Expect(200)),
    Case(
        "load-name-not-string",
        LOAD,
        {"lora_name": 5, "lora_path": "@good-a"},
        expect=Expect(400, "Bad Request", "body.lora_name"),
    ),
    Case("unload-base-name", UNLOAD, {"lora_name": BASE}, expect=Expect(404, "NotFoundError", None)),
    Case("ping", "/ping", method="GET", expect=Expect(200, body="")),
    Case("unknown-route", "/v1/nope", method="GET", expect=Expect(404, body='{"detail":"Not Found"}')),
    Case("wrong-method", COMPLETIONS, method="GET", expect=Expect(405, body='{"detail":"Method Not Allowed"}')),
    Case("health", "/health", method="GET", expect=Expect(200, body="")),
)


def resolve(engine: Engine, body: Any) -> Any:
    if isinstance(body, dict):
        return {k: resolve(engine, v) for k, v in body.items()}
    if isinstance(body, str) and body.startswith("@"):
        return engine.paths[body[1:]]
    return body


def send(engine: Engine, case: Case) -> Response:
    body = resolve(engine, case.body)
    if case.content_type != "application/json" or isinstance(body, bytes):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return engine.request(case.method, case.path, raw, content_type=case.content_type)
    return engine.request(case.method, case.path, body)


def check(expect: Expect, got: Response) -> None:
    assert got.status == expect.status, got.text
    if expect.body is not None:
        assert got.text == expect.body
    if expect.err_type is not None:
        error = got.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == expect.err_type, error
        assert error["code"] == expect.status
        if expect.param != "<any>":
            assert error["param"] == expect.param, error
        for words in expect.says:
            assert words in error["message"], error


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(engine: Engine, case: Case) -> None:
    for path, body in case.setup:
        setup = engine.post(path, resolve(engine, body))
        assert setup.status == 200, f"setup {path}: {setup.text}"
    got = send(engine, case)
    check(case.sim if engine.kind == "sim" and case.sim is not None else case.expect, got)


# -- shapes: JSON key sets of the answers the router and users parse -------------------------------

COMPLETION_KEYS = {
    "id", "object", "created", "model", "choices", "usage", "service_tier", "system_fingerprint",
    "kv_transfer_params", "ec_transfer_params", "metrics",
}  # fmt: skip
COMPLETION_CHOICE_KEYS = {
    "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_logprobs",
    "prompt_token_ids", "routed_experts",
}  # fmt: skip
USAGE_KEYS = {
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
}
CHAT_KEYS = {
    "id", "object", "created", "model", "choices", "usage", "service_tier", "system_fingerprint",
    "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics",
}  # fmt: skip
CHAT_CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"}
COMPLETION_CHUNK_CHOICE_KEYS = {
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "prompt_token_ids",
    "token_ids",
}
CHAT_MESSAGE_KEYS = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}


def test_completion_shape(engine: Engine) -> None:
    got = engine.post(COMPLETIONS, {"model": "static", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert got.status == 200, got.text
    body = got.json()
    assert set(body) == COMPLETION_KEYS
    assert body["object"] == "text_completion" and body["model"] == "static"
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert set(choice) == COMPLETION_CHOICE_KEYS
    assert choice["finish_reason"] == "length"
    assert set(body["usage"]) == USAGE_KEYS
    assert body["usage"]["completion_tokens"] == 4


def test_chat_shape(engine: Engine) -> None:
    got = engine.post(
        CHAT, {"model": "static", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "ignore_eos": True}
    )
    assert got.status == 200, got.text
    body = got.json()
    assert set(body) == CHAT_KEYS
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert set(choice) == CHAT_CHOICE_KEYS
    assert set(choice["message"]) == CHAT_MESSAGE_KEYS
    assert choice["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3


def sse(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def test_completion_stream_shape(engine: Engine) -> None:
    body = {"model": "static", "prompt": "Hi", "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    got = engine.post(COMPLETIONS, body)
    assert got.status == 200 and got.content_type.startswith("text/event-stream"), got.text
    chunks = sse(got.text)
    *tokens, usage = chunks
    assert tokens and all(c["object"] == "text_completion" and c["model"] == "static" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in tokens][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens[:-1])
    assert len({c["id"] for c in chunks}) == 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert all(set(c["choices"][0]) == COMPLETION_CHUNK_CHOICE_KEYS for c in tokens)


def test_chat_stream_shape(engine: Engine) -> None:
    body = {
        "model": "static",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
    }
    got = engine.post(CHAT, body)
    assert got.status == 200, got.text
    chunks = sse(got.text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert set(chunks[0]["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
    assert set(chunks[-1]["choices"][0]) == {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"}


def test_n_returns_n_choices(engine: Engine) -> None:
    got = engine.post(COMPLETIONS, {"model": "static", "prompt": "Hi", "max_tokens": 3, "n": 2, "ignore_eos": True})
    assert got.status == 200, got.text
    body = got.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6


# -- /v1/models ----------------------------------------------------------------------------------------

CARD_KEYS = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}


def test_model_cards(engine: Engine) -> None:
    got = engine.request("GET", "/v1/models")
    assert got.status == 200
    body = got.json()
    assert body["object"] == "list"
    cards = {c["id"]: c for c in body["data"]}
    assert all(set(c) == CARD_KEYS for c in cards.values())
    base, static = cards[BASE], cards["static"]
    assert (base["root"], base["parent"], base["max_model_len"]) == (engine.cfg.model, None, MAX_MODEL_LEN)
    assert (static["root"], static["parent"], static["max_model_len"]) == (engine.paths["static"], BASE, None)
    assert base["owned_by"] == "vllm" and base["object"] == "model"
    assert re.fullmatch(r"modelperm-[0-9a-f]{16}", static["permission"][0]["id"])


# -- adapters change the output; an in-place reload from a new path changes it again ---------------


def _text(engine: Engine, model: str) -> str:
    got = engine.post(
        COMPLETIONS, {"model": model, "prompt": "The swap test", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    )
    assert got.status == 200, got.text
    return str(got.json()["choices"][0]["text"])


def test_inplace_reload_changes_the_output(engine: Engine) -> None:
    assert engine.post(LOAD, load("swap", engine.paths["good-a"])).status == 200
    before = _text(engine, "swap")
    assert before == _text(engine, "swap"), "greedy output must be repeatable"
    assert _text(engine, BASE) != before
    assert engine.post(LOAD, load("swap", engine.paths["good-b"], inplace=True)).status == 200
    assert _text(engine, "swap") != before


# -- adapters that do not fit: what vLLM serves, and that the verifier refuses each --------------------


def test_what_vllm_serves_for_an_adapter_that_does_not_fit(engine: Engine) -> None:
    """vLLM (200 at load above) answers with base-model output when no name matches a module, and
    with changed output when some layers do; the simulator refused them at load."""
    for name, same_as_base in (("other-prefix", True), ("too-many-layers", False)):
        loaded = engine.post(LOAD, load(f"served-{name}", engine.paths[name]))
        if engine.kind == "sim":
            assert loaded.status == 500, loaded.text
            continue
        assert loaded.status == 200, loaded.text
        assert (_text(engine, f"served-{name}") == _text(engine, BASE)) is same_as_base, name
        assert engine.post(UNLOAD, {"lora_name": f"served-{name}"}).status == 200


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("wrong-base", f"{BASE} expects [8, 512]"),
        ("other-prefix", "vllm#34186"),
        ("too-many-layers", "is for layer 2"),
        ("rank-mismatch", "says r=8 for it"),
        ("module-base-lacks", "the base has no module 'c_attn'"),
        ("no-lora-tensors", "holds no LoRA tensors"),
    ],
)
def test_verified_before_any_load_each_is_refused(adapter_paths: dict[str, str], name: str, words: str) -> None:
    """Every adapter of the rows above that vLLM loads or refuses is refused by the sidecar's verifier."""
    base = BaseShape.from_config(llama_config(DEFAULT_SPEC), name=BASE)
    with pytest.raises(AdapterError, match=re.escape(words)):
        verify_adapter_dir(Path(adapter_paths[name]), base, where=name)
    assert verify_adapter_dir(Path(adapter_paths["good-a"]), base, where="good-a").tensors > 0


# -- metrics ------------------------------------------------------------------------------------------

# What the router, the sidecar, the benchmark and dashboards read; vLLM exports many more.
METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
)


def test_metric_names_and_labels(engine: Engine) -> None:
    assert engine.post(COMPLETIONS, {"model": BASE, "prompt": "Hi", "max_tokens": 2}).status == 200
    page = samples(engine.request("GET", "/metrics").text)
    for name in METRICS:
        assert name in page, f"{name} missing from {sorted(n for n in page if n.startswith('vllm:'))}"
        assert all({"model_name", "engine"} <= set(labels) for labels, _ in page[name]), name
        assert any(labels["model_name"] == BASE and labels["engine"] == "0" for labels, _ in page[name]), name
    reasons = {labels["finished_reason"] for labels, _ in page["vllm:request_success_total"]}
    assert {"stop", "length", "abort"} <= reasons
    info = page["vllm:lora_requests_info"]
    assert all(set(labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"} for labels, _ in info)
    for name, buckets in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
        ("vllm:e2e_request_latency_seconds", LATENCY_BUCKETS),
    ):
        bounds = [float(labels["le"]) for labels, _ in page[f"{name}_bucket"]]
        assert bounds == [*buckets, float("inf")], name


def test_more_adapters_in_flight_than_slots_wait_and_none_fails(engine: Engine) -> None:
    """max_loras=1 and three adapters at once: every request is answered; vLLM 0.32 (and the
    simulator) list the running batch's adapters, the same names in running_lora_adapters and
    waiting_lora_adapters, so over the run each adapter shows, one at a time."""
    names = ("slot-a", "slot-b", "slot-c")
    for name, path in zip(names, ("good-a", "good-b", "good-c"), strict=True):
        assert engine.post(LOAD, load(name, engine.paths[path])).status == 200

    def ask(model: str) -> Response:
        return engine.post(COMPLETIONS, {"model": model, "prompt": "Hi", "max_tokens": 24, "ignore_eos": True})

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(ask, [*names, *names]))
    assert [a.status for a in answers] == [200] * 6, [a.text for a in answers if a.status != 200]
    assert all(a.json()["usage"]["completion_tokens"] == 24 for a in answers)

    def idle_labels() -> dict[str, str] | None:
        labels = latest_labels(engine.request("GET", "/metrics").text, "vllm:lora_requests_info")
        return labels if labels and labels["running_lora_adapters"] == "" else None

    wait_until("lora_requests_info to show an idle engine", idle_labels, timeout_s=30)
    info = samples(engine.request("GET", "/metrics").text)["vllm:lora_requests_info"]
    assert all(labels["max_lora"] == str(MAX_LORAS) for labels, _ in info)
    seen: set[str] = set()
    for labels, _ in info:
        running = set(filter(None, labels["running_lora_adapters"].split(",")))
        waiting = set(filter(None, labels["waiting_lora_adapters"].split(",")))
        assert running == waiting and len(running) <= MAX_LORAS, labels
        seen |= running
    assert set(names) <= seen


# -- the prefix cache ---------------------------------------------------------------------------------


def _ids(seed: int, n: int = 200) -> list[int]:
    """A token-id prompt no other row sends (byte tokens of the tiny model's 320)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(n)]


def _prefix_counters(engine: Engine) -> tuple[float, float]:
    page = engine.request("GET", "/metrics").text
    return metric_value(page, "vllm:prefix_cache_queries_total"), metric_value(page, "vllm:prefix_cache_hits_total")


def _hit_tokens(engine: Engine, model: str, ids: list[int]) -> int:
    """The prefix-cache hit of one request, in tokens, from the engine's own counters."""
    queries, hits = _prefix_counters(engine)
    answer = engine.post(COMPLETIONS, {"model": model, "prompt": ids, "max_tokens": 1})
    assert answer.status == 200, answer.text

    def counted() -> tuple[float, float] | None:
        now = _prefix_counters(engine)
        return now if now[0] >= queries + len(ids) else None

    # vLLM records a step's stats after it hands the request its tokens: wait until they are counted
    after = wait_until("the prefix-cache counters to count the request", counted, timeout_s=30)
    assert after[0] == queries + len(ids), "every prompt token is looked up once"
    return int(after[1] - hits)


def test_a_repeated_prefix_hits_the_cache_per_adapter_and_a_hot_swap_misses(engine: Engine) -> None:
    """vLLM caches full blocks by a hash chained over the prompt and salted by the adapter's name
    and path; a hit stops short of the last token, which is always computed."""
    for name, path in (("prefix-a", "good-a"), ("prefix-b", "good-b")):
        assert engine.post(LOAD, load(name, engine.paths[path])).status == 200
    prompt, fresh = _ids(1), _ids(2)
    whole = (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert _hit_tokens(engine, BASE, prompt) == 0  # never sent
    assert _hit_tokens(engine, "prefix-a", prompt) == 0  # the base model's blocks are not the adapter's
    assert _hit_tokens(engine, "prefix-a", prompt) == whole
    assert _hit_tokens(engine, "prefix-b", prompt) == 0  # nor another adapter's
    head = 3 * BLOCK_SIZE
    assert _hit_tokens(engine, "prefix-a", prompt[:head] + fresh[head:]) == head  # a shared head hits only it
    assert _hit_tokens(engine, BASE, prompt) == whole
    swapped = load("prefix-a", engine.paths["good-c"], inplace=True)  # the same name from another path
    assert engine.post(LOAD, swapped).status == 200
    assert _hit_tokens(engine, "prefix-a", prompt) == 0


# -- the tolerance table ------------------------------------------------------------------------------


def test_every_tolerated_difference_is_in_the_sim_readme() -> None:
    text = SIM_README.read_text()
    header = f"| case | vLLM {CPU_TIER} CPU (the release its `/version` answered) | simulator (`--vllm-version {CPU_TIER}`) |"
    assert header in text, f"the tolerance table in {SIM_README} must name the release the rows ran, {CPU_TIER}"
    for case in CASES:
        if case.sim is not None:
            assert case.why, f"case {case.id}: a tolerated difference needs a reason"
            assert f"| `{case.id}` |" in text, f"case {case.id} is missing from the tolerance table in {SIM_README}"
