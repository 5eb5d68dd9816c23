"""Write small but real PEFT LoRA adapter directories.

An adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors``
exactly as PEFT saves them (tensor names ``base_model.model.model.layers.N.<module>.lora_A.weight``),
with tiny dimensions so tests stay fast. Used by tests, the benchmark and ``lorapool dev``.

Run as a script to make fixtures:  ``python -m lorapool_dev.testing.peft OUT_DIR --rank 8 --name sql``
"""

from __future__ import annotations

import argparse
import enum
import json
import random
import re
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lorapool.sources import layout

DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


def safetensors_bytes(tensors: dict[str, tuple[Sequence[int], bytes]], dtype: str = "F16") -> bytes:
    """Serialise ``name -> (shape, raw bytes)`` in the safetensors format (header + data)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    chunks: list[bytes] = []
    for name in sorted(tensors):
        shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    raw_header = json.dumps(header, separators=(",", ":")).encode()
    raw_header += b" " * (-len(raw_header) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw_header)) + raw_header + b"".join(chunks)


def normal_f16(rng: random.Random, count: int, std: float) -> bytes:
    """``count`` little-endian float16 values drawn from N(0, std) by ``rng`` (finite, seeded)."""
    return struct.pack(f"<{count}e", *(rng.gauss(0.0, std) for _ in range(count)))


def normal_f32(rng: random.Random, count: int, std: float, mean: float = 0.0) -> bytes:
    """``count`` little-endian float32 values drawn from N(mean, std) by ``rng``."""
    return struct.pack(f"<{count}f", *(rng.gauss(mean, std) for _ in range(count)))


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file; raises ValueError when the file is not one."""
    return layout.read_safetensors_header(path)[0]


def write_peft_adapter(
    out_dir: Path,
    *,
    rank: int = 8,
    base_model: str = "meta-llama/Meta-Llama-3-8B-Instruct",
    target_modules: Sequence[str] = DEFAULT_TARGETS,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    extra_config: dict[str, Any] | None = None,
    module_shapes: Mapping[str, tuple[int, int]] | None = None,
    std: float | None = None,
    name_prefix: str = "base_model.model.model",
    weights_rank: int | None = None,
) -> Path:
    """Write a PEFT LoRA adapter into ``out_dir`` (created) and return it.

    By default every module is ``hidden_size -> hidden_size`` and the F16 tensors are random
    bytes (some NaN): enough for anything that reads headers and shapes. For a real engine,
    give ``module_shapes`` (module -> ``(out_features, in_features)`` of the base layer) and
    ``std``: the tensors are then seeded normal values, finite, that change the model's output.
    A ``rank_pattern`` in ``extra_config`` gives its modules that rank, as PEFT saves them.
    ``name_prefix`` (PEFT's is ``base_model.model.model``) and ``weights_rank`` (default: the
    config's) write the misfits ``write_misfit_adapter`` names.
    """
    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, tuple[Sequence[int], bytes]] = {}
    for layer in range(num_layers):
        for module in target_modules:
            group = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            prefix = f"{name_prefix}.layers.{layer}.{group}.{module}"
            out_features, in_features = (module_shapes or {}).get(module, (hidden_size, hidden_size))
            r = weights_rank or _pattern_rank(module, rank, (extra_config or {}).get("rank_pattern") or {})
            for part, shape in (("lora_A", (r, in_features)), ("lora_B", (out_features, r))):
                count = shape[0] * shape[1]
                data = rng.randbytes(2 * count) if std is None else normal_f16(rng, count, std)
                tensors[f"{prefix}.{part}.weight"] = (shape, data)
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.05,
        "target_modules": list(target_modules),
        "bias": "none",
        "use_dora": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
    config.update(extra_config or {})
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "adapter_model.safetensors").write_bytes(safetensors_bytes(tensors))
    return out_dir


def _pattern_rank(module: str, rank: int, pattern: Mapping[str, int]) -> int:
    """The rank PEFT gives ``module`` under ``rank_pattern`` (the first key matching its end)."""
    return next((value for key, value in pattern.items() if re.fullmatch(rf"(.*\.)?({key})", module)), rank)


def base_module_shapes(base_model: str) -> dict[str, tuple[int, int]] | None:
    """Each LoRA-able module's ``(out_features, in_features)`` in a base the planner's table knows
    (``lorapool.plan.dims``), None for another: give it as ``module_shapes`` so the adapter fits the
    shape the operator renders for the sidecar's verifier (``lorapool.sources.verify``), which says
    what each module's shape is made of (``BaseShape.features``)."""
    from lorapool.plan.adapter_check import ATTENTION, MLP, BaseShape
    from lorapool.plan.dims import lookup_model

    dims = lookup_model(base_model)
    if dims is None:
        return None
    shape = BaseShape.from_dims(dims)
    return {m: (shape.features(m)[0][0], shape.features(m)[1][0]) for m in (*ATTENTION, *MLP)}


class Misfit(enum.StrEnum):
    """Real PEFT adapters that do not fit their base, one per refusal of ``lorapool.sources.verify``."""

    OTHER_SHAPE = "other-shape"  # trained on a model with other dimensions
    OTHER_PREFIX = "other-prefix"  # saved from the bare decoder: names match no module (vllm#34186)
    TOO_MANY_LAYERS = "too-many-layers"  # two layers more than the base has
    RANK_MISMATCH = "rank-mismatch"  # weights at twice the config's r
    MODULE_BASE_LACKS = "module-base-lacks"  # a GPT-2 style c_attn beside q_proj
    NO_LORA_TENSORS = "no-lora-tensors"  # a weights file with no tensor at all


def write_misfit_adapter(
    out_dir: Path,
    misfit: Misfit,
    *,
    module_shapes: Mapping[str, tuple[int, int]],
    num_layers: int,
    rank: int = 8,
    seed: int = 0,
    std: float | None = None,
    base_model: str = "tiny-llama",
) -> Path:
    """An adapter for the base of ``module_shapes`` and ``num_layers`` with one ``misfit``."""
    targets: tuple[str, ...] = tuple(module_shapes)
    shapes: dict[str, tuple[int, int]] = dict(module_shapes)
    kwargs: dict[str, Any] = {}
    if misfit is Misfit.OTHER_SHAPE:
        shapes = {m: (out // 2, inp // 2) for m, (out, inp) in module_shapes.items()}
    elif misfit is Misfit.OTHER_PREFIX:
        kwargs["name_prefix"] = "base_model.model"
    elif misfit is Misfit.TOO_MANY_LAYERS:
        num_layers += 2
    elif misfit is Misfit.RANK_MISMATCH:
        kwargs["weights_rank"] = 2 * rank
    elif misfit is Misfit.MODULE_BASE_LACKS:
        targets, shapes = (*targets, "c_attn"), {**shapes, "c_attn": next(iter(shapes.values()))}
    elif misfit is Misfit.NO_LORA_TENSORS:
        targets = ()
    return write_peft_adapter(
        out_dir,
        rank=rank,
        base_model=base_model,
        target_modules=targets,
        num_layers=num_layers,
        seed=seed,
        module_shapes=shapes,
        std=std,
        extra_config={"lora_alpha": 2 * rank},
        **kwargs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a small real PEFT LoRA adapter directory.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--base-model", default="meta-llama/Meta-Llama-3-8B-Instruct")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dora", action="store_true", help="mark it DoRA (vLLM refuses it)")
    args = parser.parse_args(argv)
    extra = {"use_dora": True} if args.dora else None
    path = write_peft_adapter(
        args.out_dir, rank=args.rank, base_model=args.base_model, seed=args.seed, extra_config=extra
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
