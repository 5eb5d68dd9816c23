"""Runtime adapter loading and unloading against real PEFT directories, with vLLM's status codes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.sim.conftest import Sim, StartSim

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


@pytest.fixture(scope="module")
def sim(start_sim: StartSim) -> Sim:
    return start_sim(
        "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4", "--max-lora-rank", "16", "--time-scale", "0"
    )


def model_ids(sim: Sim) -> set[str]:
    return {card.id for card in sim.client().models.list().data}


def test_load_use_and_unload(sim: Sim, adapters: Callable[..., Path]) -> None:
    path = adapters("fin", rank=16)
    status, text = sim.request("POST", LOAD, {"lora_name": "fin", "lora_path": str(path)})
    assert (status, text) == (200, "Success: LoRA adapter 'fin' added successfully.")
    assert "fin" in model_ids(sim)
    result = sim.client().completions.create(model="fin", prompt="hi", max_tokens=2)
    assert result.model == "fin"
    status, text = sim.request("POST", UNLOAD, {"lora_name": "fin"})
    assert (status, text) == (200, "Success: LoRA adapter 'fin' removed successfully.")
    assert "fin" not in model_ids(sim)
    assert sim.post("/v1/completions", {"model": "fin", "prompt": "hi"})[0] == 404


def test_loading_the_same_name_twice_is_400_unless_in_place(sim: Sim, adapters: Callable[..., Path]) -> None:
    first, second = adapters("twice-v1", rank=8), adapters("twice-v2", rank=8, seed=1)
    assert sim.post(LOAD, {"lora_name": "twice", "lora_path": str(first)})[0] == 200
    status, body = sim.post(LOAD, {"lora_name": "twice", "lora_path": str(second)})
    assert status == 400
    assert body["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in body["error"]["message"]
    status, text = sim.post(LOAD, {"lora_name": "twice", "lora_path": str(second), "load_inplace": True})
    assert (status, text) == (200, "Success: LoRA adapter 'twice' added successfully.")
    roots = {card.id: card.model_dump()["root"] for card in sim.client().models.list().data}
    assert roots["twice"] == str(second)


@pytest.mark.parametrize(
    ("extra", "damage", "status", "err_type", "message"),
    [
        pytest.param(None, "missing", 404, "NotFoundError", "No adapter found for", id="path-missing-404"),
        pytest.param(
            {"r": 64},
            None,
            500,
            "InternalServerError",
            "LoRA rank 64 is greater than max_lora_rank 16.",
            id="rank-too-high-500",
        ),
        pytest.param({"use_dora": True}, None, 500, "InternalServerError", "DoRA", id="dora-500"),
        pytest.param(None, "corrupt", 500, "InternalServerError", "safetensors", id="corrupt-safetensors-500"),
        pytest.param(None, "no-tensors", 500, "InternalServerError", "doesn't contain tensors", id="no-tensors-500"),
    ],
)
def test_refused_loads(
    sim: Sim,
    adapters: Callable[..., Path],
    extra: dict[str, object] | None,
    damage: str | None,
    status: int,
    err_type: str,
    message: str,
) -> None:
    """vLLM 0.32 answers 500 for an adapter its worker refuses, 404 when absent (tests/conformance)."""
    name = f"bad-{status}-{err_type}-{damage}-{bool(extra)}"
    path = adapters(name, rank=8, extra_config=extra)
    if damage == "missing":
        path = path / "does-not-exist"
    elif damage == "corrupt":
        (path / "adapter_model.safetensors").write_bytes(b"\x00" * 7)
    elif damage == "no-tensors":
        (path / "adapter_model.safetensors").unlink()
    got, body = sim.post(LOAD, {"lora_name": name, "lora_path": str(path)})
    assert got == status
    assert body["error"]["code"] == status
    assert body["error"]["type"] == err_type
    assert message in body["error"]["message"]
    assert name not in model_ids(sim)


@pytest.mark.parametrize(
    ("body", "err_type", "param"),
    [
        pytest.param({"lora_name": "x"}, "Bad Request", "body.lora_path", id="no-path"),
        pytest.param({"lora_path": "/x"}, "Bad Request", "body.lora_name", id="no-name"),
        pytest.param({"lora_name": "", "lora_path": "/x"}, "InvalidUserInput", None, id="empty-name"),
    ],
)
def test_load_needs_name_and_path(sim: Sim, body: dict[str, str], err_type: str, param: str | None) -> None:
    """A missing field is FastAPI's validation error; an empty one is vLLM's own check (as vLLM 0.32)."""
    status, reply = sim.post(LOAD, body)
    assert status == 400
    assert (reply["error"]["type"], reply["error"]["param"], reply["error"]["code"]) == (err_type, param, 400)
    if err_type == "InvalidUserInput":
        assert reply["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
    else:
        assert "Field required" in reply["error"]["message"]


def test_unloading_an_unknown_adapter_is_404(sim: Sim) -> None:
    status, body = sim.post(UNLOAD, {"lora_name": "never-loaded"})
    assert status == 404
    assert body["error"]["message"] == "The lora adapter 'never-loaded' cannot be found."
    assert sim.post(UNLOAD, {})[0] == 400


@pytest.mark.parametrize("value", ["false", "0", ""])
def test_runtime_updating_disabled_hides_the_endpoints(
    start_sim: StartSim, adapters: Callable[..., Path], value: str
) -> None:
    path = adapters("static", rank=8)
    sim = start_sim(
        "--enable-lora",
        "--time-scale",
        "0",
        "--lora-modules",
        f"static={path}",
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value},
    )
    assert sim.request("POST", LOAD, {"lora_name": "y", "lora_path": str(path)}) == (404, '{"detail":"Not Found"}')
    assert sim.request("POST", UNLOAD, {"lora_name": "static"})[0] == 404
    assert "static" in model_ids(sim)  # --lora-modules still load


def test_loading_without_enable_lora_is_refused(start_sim: StartSim, adapters: Callable[..., Path]) -> None:
    sim = start_sim("--time-scale", "0")
    status, body = sim.post(LOAD, {"lora_name": "z", "lora_path": str(adapters("z", rank=8))})
    assert status == 400
    assert "--enable-lora" in body["error"]["message"]
