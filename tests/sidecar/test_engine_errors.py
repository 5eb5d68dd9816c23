"""How the sidecar reads a failed load: refused adapter (permanent) or engine trouble (retry).

The messages are vLLM 0.32 (CPU)'s own, as measured by tests/conformance against the real engine.
"""

from __future__ import annotations

import pytest

from lorapool.sidecar.engine import EngineError, load_failure_is_permanent


def _worker(reason: str) -> str:
    return f"Call to add_lora method failed: Worker failed with error '{reason}', please check the stack trace above for the root cause"


@pytest.mark.parametrize(
    ("status", "detail", "permanent"),
    [
        pytest.param(500, _worker("LoRA rank 64 is greater than max_lora_rank 16."), True, id="rank-too-high-500"),
        pytest.param(500, _worker("vLLM does not yet support DoRA."), True, id="dora-500"),
        pytest.param(
            500,
            _worker("Error while deserializing header: incomplete metadata, file not fully covered"),
            True,
            id="corrupt-500",
        ),
        pytest.param(500, _worker("Adapter bias is not supported."), True, id="bias-500"),
        pytest.param(
            500,
            _worker('vLLM only supports modules_to_save being either None or ["classifier", "score"]'),
            True,
            id="modules-to-save-500",
        ),
        pytest.param(
            500,
            _worker("adapter_model.safetensors is not a readable safetensors file: ..."),
            True,
            id="sim-corrupt-500",
        ),
        pytest.param(
            500, "Call to add_lora method failed: EngineCore encountered an issue.", False, id="engine-core-dead-500"
        ),
        pytest.param(500, "Internal Server Error", False, id="plain-500"),
        pytest.param(503, "Service Unavailable", False, id="unavailable-503"),
        pytest.param(None, "connection refused", False, id="no-answer"),
        pytest.param(429, "Too Many Requests", False, id="throttled-429"),
        pytest.param(400, "The lora adapter 'a' has already been loaded.", True, id="duplicate-400"),
        pytest.param(404, "Loading lora a failed: No adapter found for <path>", True, id="path-missing-404"),
    ],
)
def test_load_failures_are_classified(status: int | None, detail: str, permanent: bool) -> None:
    assert load_failure_is_permanent(status, detail) is permanent


@pytest.mark.parametrize(("status", "permanent"), [(None, False), (400, True), (404, True), (500, False), (503, False)])
def test_engine_error_defaults_and_transient_mirror(status: int | None, permanent: bool) -> None:
    error = EngineError("x", status=status)
    assert (error.permanent, error.transient) == (permanent, not permanent)
    assert EngineError("x", status=500, permanent=True).transient is False
