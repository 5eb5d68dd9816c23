"""Verify a PEFT adapter directory against the base model before any load: the thin file-reading shell
over ``lorapool.plan.adapter_check`` (which decides).

Called by the sidecar's ``Downloader`` after a download (every source), by the simulator (it refuses
what it would otherwise serve wrongly) and by ``lorapool adapter push`` offline. Reads
``adapter_config.json`` and the safetensors header only (names, dtypes, shapes); no weights are
loaded. ``base=None`` (the base's shape is unknown) checks config and weights only, and says so.
"""

from __future__ import annotations

from pathlib import Path

from lorapool.api.peft import parse_adapter_config
from lorapool.errors import AdapterError
from lorapool.plan.adapter_check import BaseShape, Verification, check_adapter, tensors_from_header
from lorapool.sources.layout import (
    BIN_FILE,
    CONFIG_FILE,
    SAFETENSORS_FILE,
    check_safetensors,
    parse_config_bytes,
    read_safetensors_header,
)

__all__ = ["BaseShape", "Verification", "verify_adapter_dir"]

_MAX_CONFIG_BYTES = 1 << 20  # a PEFT config is a few KB; the sidecar's Limits say the same


def verify_adapter_dir(root: Path, base: BaseShape | None, *, where: str) -> Verification:
    """Check the adapter in ``root``; raise AdapterError (permanent: fix the adapter) naming the reason."""
    config_file, weights = root / CONFIG_FILE, root / SAFETENSORS_FILE
    for path in (config_file, weights):
        if path.is_symlink():  # it could name any file on the machine
            raise AdapterError(f"{where}: {path.name} is a symbolic link; publish the file itself")
    if not config_file.is_file():
        raise AdapterError(f"{where}: {CONFIG_FILE} is missing; save the adapter with PEFT's save_pretrained")
    if config_file.stat().st_size > _MAX_CONFIG_BYTES:
        raise AdapterError(f"{where}: {CONFIG_FILE} exceeds {_MAX_CONFIG_BYTES} bytes; it is not a PEFT config")
    raw = parse_config_bytes(config_file.read_bytes(), where=where)
    config = parse_adapter_config(raw, where=f"{where}: {CONFIG_FILE}")
    if not weights.is_file():
        if (root / BIN_FILE).is_file():  # a pickle: not read without torch (and not safely)
            return Verification(
                checked=f"config only: {BIN_FILE} is not read (convert it to {SAFETENSORS_FILE} to verify it)",
                tensors=0,
                modules=(),
                layers=0,
                rank=config.rank,
            )
        raise AdapterError(f"{where}: no {SAFETENSORS_FILE}; upload the adapter weights")
    check_safetensors(weights, where=where)
    try:
        header, _ = read_safetensors_header(weights)
    except ValueError as exc:  # check_safetensors read it a moment ago; the file changed under us
        raise AdapterError(f"{where}: {exc}; re-upload it") from exc
    return check_adapter(tensors_from_header(header, where=where), config, base, where=where)
