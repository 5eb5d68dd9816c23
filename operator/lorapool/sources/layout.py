"""Which files make a servable PEFT adapter directory, and which names are safe.

Pure apart from reading the candidate directory. Used after every download (any
source) so the store only ever holds what vLLM's LoRA loader reads.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from lorapool.api.common import ADAPTER_NAME_PATTERN
from lorapool.errors import AdapterError, UnsafePathError

CONFIG_FILE = "adapter_config.json"
SAFETENSORS_FILE = "adapter_model.safetensors"
BIN_FILE = "adapter_model.bin"
WEIGHT_FILES: tuple[str, ...] = (SAFETENSORS_FILE, BIN_FILE)  # first present wins, as in vLLM
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
    }
)
KEPT_FILES = frozenset({CONFIG_FILE, *WEIGHT_FILES, *TOKENIZER_FILES})

_NAME = re.compile(ADAPTER_NAME_PATTERN)


def check_name(name: str) -> str:
    """Return ``name`` if it is a DNS-1123 label (so a safe path segment), else raise."""
    if not isinstance(name, str) or len(name) > 63 or not _NAME.match(name):
        raise UnsafePathError(
            f"adapter name {name!r} is not a DNS-1123 label (lowercase a-z, 0-9, '-', at most 63); rename the adapter"
        )
    return name


def find_adapter_root(tree: Path, *, where: str) -> Path:
    """The shallowest directory under ``tree`` holding adapter_config.json (archives often
    wrap the files in one top folder). Two candidates at the same depth are ambiguous."""
    candidates = sorted(tree.rglob(CONFIG_FILE), key=lambda p: (len(p.parts), str(p)))
    candidates = [p for p in candidates if p.is_file() and not p.is_symlink()]
    if not candidates:
        raise AdapterError(
            f"{where}: no {CONFIG_FILE} found; a PEFT adapter needs {CONFIG_FILE} and "
            f"{SAFETENSORS_FILE} (save it with model.save_pretrained)"
        )
    depth = len(candidates[0].parts)
    same_depth = [p for p in candidates if len(p.parts) == depth]
    if len(same_depth) > 1:
        dirs = ", ".join(str(p.parent.relative_to(tree)) for p in same_depth)
        raise AdapterError(f"{where}: several adapters found ({dirs}); publish one adapter per source")
    return candidates[0].parent


def pick_files(root: Path, *, where: str) -> dict[str, Path]:
    """The kept files in ``root`` (regular files only), checked for config and weights."""
    files = {p.name: p for p in root.iterdir() if p.name in KEPT_FILES and p.is_file() and not p.is_symlink()}
    if CONFIG_FILE not in files:
        raise AdapterError(f"{where}: {CONFIG_FILE} is missing; upload it next to the weights")
    weights = [w for w in WEIGHT_FILES if w in files]
    if not weights:
        raise AdapterError(f"{where}: no {SAFETENSORS_FILE} (or {BIN_FILE}); upload the adapter weights")
    if len(weights) == 2:  # vLLM reads safetensors first; the .bin would be dead weight
        del files[BIN_FILE]
    return files


def weights_name(files: dict[str, Path]) -> str:
    return next(w for w in WEIGHT_FILES if w in files)


def parse_config_bytes(raw: bytes, *, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{where}: {CONFIG_FILE} is not valid JSON ({exc}); re-save the adapter") from exc
    if not isinstance(value, dict):
        raise AdapterError(f"{where}: {CONFIG_FILE} must hold a JSON object; re-save the adapter")
    return value


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and its length in bytes; cheap, the tensors are not read.

    Raises ValueError saying what is wrong when the file is not a safetensors file. Shared by the
    sidecar's checks, the simulator's refusals and the tests' adapter writers.
    """
    with path.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path.name} is truncated ({path.stat().st_size} bytes)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(path.stat().st_size - 8, 100 * (1 << 20)):
            raise ValueError(f"{path.name} is not a safetensors file")
        try:
            header = json.loads(fh.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path.name} has a corrupt header") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has a corrupt header")
    return header, header_len


def check_safetensors(path: Path, *, where: str) -> None:
    """Refuse a truncated or garbled safetensors file before vLLM does (cheap: header only)."""
    size = path.stat().st_size
    try:
        header, header_len = read_safetensors_header(path)
    except ValueError as exc:
        raise AdapterError(f"{where}: {exc}; re-upload it") from exc
    end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise AdapterError(f"{where}: {path.name}: tensor {key!r} has no data_offsets; re-upload it")
        end = max(end, offsets[1])
    if 8 + header_len + end != size:
        raise AdapterError(
            f"{where}: "
            f"{path.name} is {size} bytes but its header describes {8 + header_len + end}; "
            "the file is truncated or corrupt, re-upload it"
        )
