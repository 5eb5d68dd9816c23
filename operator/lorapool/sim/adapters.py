"""Read a PEFT adapter directory and refuse what vLLM refuses, with vLLM's status codes.

Called by the HTTP shell for ``/v1/load_lora_adapter`` and for ``--lora-modules`` at start-up.
It reads the real files: ``adapter_config.json`` through ``lorapool.api.peft`` and the
safetensors header through ``lorapool.sources.layout``; the tensors themselves are never loaded.
After vLLM's own refusals it runs the verifier every source goes through (``lorapool.sources.verify``,
against ``base``: the shape of the model the simulator stands in for, when it knows it). vLLM loads
those adapters and serves them wrongly (tests/conformance records what it does with each); the
simulator refuses them with the same 500 as any other worker failure, a tolerated difference.

Status codes follow vLLM 0.32's ``OpenAIServingModels.load_lora_adapter``, measured against the
real engine in ``tests/conformance``: a missing adapter (``No adapter found``) is 404
``NotFoundError``; any other failure of the engine's ``add_lora`` (rank above
``--max-lora-rank``, DoRA, unreadable tensors, a bad config) is **500** ``InternalServerError``
with the worker's reason wrapped as ``Call to add_lora method failed: Worker failed with error
'<reason>', please check the stack trace above for the root cause``. A client tells "bad
adapter" from "engine down" by reading that message (``lorapool.sidecar.engine`` does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lorapool.api.peft import AdapterConfig, parse_adapter_config
from lorapool.errors import AdapterError
from lorapool.sources.layout import read_safetensors_header
from lorapool.sources.verify import BaseShape, verify_adapter_dir

# Modules vLLM's Llama implementation accepts LoRA weights for (packed into qkv/gate_up).
LLAMA_LORA_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head"}
)
_TENSOR_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")


def worker_failure(reason: str) -> AdapterLoadError:
    """vLLM 0.32's 500 for an adapter its worker refused (the reason is the worker's own words)."""
    return AdapterLoadError(
        500,
        "InternalServerError",
        f"Call to add_lora method failed: Worker failed with error '{reason}', "
        "please check the stack trace above for the root cause",
    )


class AdapterLoadError(Exception):
    """A load vLLM would refuse: HTTP status, vLLM error type and message."""

    def __init__(self, status: int, err_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message


@dataclass(frozen=True)
class AdapterFiles:
    """What the simulator keeps of a readable adapter."""

    path: str
    config: AdapterConfig
    tensor_bytes: int


def read_adapter(name: str, path: str, *, max_lora_rank: int, base: BaseShape | None = None) -> AdapterFiles:
    """Validate ``path`` as vLLM's worker would, then as ``sources.verify`` does (against ``base``; None:
    config and weights only); raise AdapterLoadError if either refuses it."""
    directory = Path(path)
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        # vLLM first tries the path as a Hugging Face repo id; the simulator has no network.
        raise AdapterLoadError(404, "NotFoundError", f"Loading lora {name} failed: No adapter found for {path}")
    try:
        raw = json.loads(config_file.read_text())
        config = parse_adapter_config(raw, where=str(config_file))
    except (OSError, ValueError, AdapterError) as exc:
        raise worker_failure(str(exc)) from exc

    if refusals := worker_refusals(config, max_lora_rank):
        raise worker_failure(" ".join(refusals))

    tensors = next((directory / f for f in _TENSOR_FILES if (directory / f).is_file()), None)
    if tensors is None:
        raise worker_failure(f"{path} doesn't contain tensors")
    if tensors.suffix != ".safetensors":
        return AdapterFiles(path=path, config=config, tensor_bytes=tensors.stat().st_size)
    try:
        modules = _check_safetensors(tensors)
    except (OSError, ValueError) as exc:
        raise worker_failure(f"{tensors.name} is not a readable safetensors file: {exc}") from exc
    if unexpected := sorted(modules - LLAMA_LORA_MODULES):
        raise worker_failure(
            f"While loading {path}, expected target modules in {sorted(LLAMA_LORA_MODULES)} "
            f"but received {unexpected}. Please verify that the loaded LoRA module is correct"
        )
    try:
        verify_adapter_dir(directory, base, where=path)
    except AdapterError as exc:
        raise worker_failure(str(exc)) from exc
    return AdapterFiles(path=path, config=config, tensor_bytes=tensors.stat().st_size)


def worker_refusals(config: AdapterConfig, max_lora_rank: int) -> list[str]:
    """Why vLLM 0.32's worker refuses a config, in its words and order (``PEFTHelper.validate_legal``)."""
    refusals: list[str] = []
    if unsupported := [m for m in config.modules_to_save if m not in ("classifier", "score")]:
        refusals.append(
            'vLLM only supports modules_to_save being either None or ["classifier", "score"] for '
            f"classification models. Unsupported modules_to_save: {unsupported}"
        )
    if config.use_dora:
        refusals.append("vLLM does not yet support DoRA.")
    if config.rank > max_lora_rank:
        refusals.append(f"LoRA rank {config.rank} is greater than max_lora_rank {max_lora_rank}.")
    if config.bias != "none":
        refusals.append("Adapter bias is not supported.")
    return refusals


def _check_safetensors(path: Path) -> set[str]:
    """The LoRA module names in a safetensors file whose header and data extent are sound."""
    header, _ = read_safetensors_header(path)
    size = path.stat().st_size
    with path.open("rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
    data_bytes = size - 8 - header_len
    modules: set[str] = set()
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"tensor {tensor!r} has no valid data_offsets")
        if offsets[1] > data_bytes:
            raise ValueError(f"tensor {tensor!r} ends at byte {offsets[1]} but the file holds {data_bytes}")
        parts = tensor.split(".")
        for marker in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            if marker in parts:
                modules.add(parts[parts.index(marker) - 1])
                break
    return modules  # none at all: the verifier refuses it
