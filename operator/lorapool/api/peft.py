"""Read a PEFT ``adapter_config.json`` the way vLLM does. Pure: dict in, facts out.

Used by the planner (an adapter's real rank), the operator (metadata read from a
source), the sidecar (verify before load) and the simulator (refuse what vLLM refuses).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lorapool.errors import AdapterError

# vLLM (vllm/config/lora.py) accepts only these values for --max-lora-rank.
VLLM_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# modules_to_save that vLLM's LoRA loader can handle (embeddings and the LM head).
_ALLOWED_MODULES_TO_SAVE = frozenset({"embed_tokens", "lm_head"})


@dataclass(frozen=True)
class AdapterConfig:
    """What matters about a PEFT LoRA adapter for serving it on vLLM."""

    rank: int  # the largest rank in the adapter: r and every rank_pattern value
    lora_alpha: float
    target_modules: tuple[str, ...]
    base_model: str | None
    use_dora: bool = False
    bias: str = "none"
    modules_to_save: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=())  # why vLLM would refuse it; empty if servable
    r: int = 0  # the config's own ``r`` (0: not recorded; ``rank`` then stands for it)
    rank_pattern: tuple[tuple[str, int], ...] = ()  # PEFT's per-module ranks, in the file's order

    @property
    def servable(self) -> bool:
        return not self.problems

    def rank_for(self, module: str) -> int:
        """The rank PEFT trained ``module`` at (its name without ``base_model.model.``).

        As vLLM's ``PEFTHelper._match_pattern``: a key matches the end of the name at a ``.``
        boundary, read as a regular expression; the first match wins, else ``r``.
        """
        for key, value in self.rank_pattern:
            try:
                if re.match(rf"(.*\.)?({key})$", module):
                    return value
            except re.error:
                if module == key or module.endswith(f".{key}"):
                    return value
        return self.r or self.rank


def parse_adapter_config(raw: Mapping[str, Any], *, where: str = "adapter_config.json") -> AdapterConfig:
    """Parse a PEFT config dict; raise AdapterError only when it is not a LoRA config at all."""
    if not isinstance(raw, Mapping):
        raise AdapterError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    peft_type = raw.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise AdapterError(f"{where}: peft_type={peft_type!r} is not LORA; vLLM serves LoRA adapters only")
    r = raw.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise AdapterError(f"{where}: 'r' must be a positive integer, got {r!r}")
    pattern = raw.get("rank_pattern") or {}
    if not isinstance(pattern, Mapping):
        raise AdapterError(f"{where}: 'rank_pattern' must be an object, got {type(pattern).__name__}")
    ranks = [r]
    for key, value in pattern.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AdapterError(f"{where}: rank_pattern[{key!r}]={value!r} must be a positive integer")
        ranks.append(value)
    rank = max(ranks)

    targets = raw.get("target_modules") or ()
    if isinstance(targets, str):  # PEFT allows a regex string
        targets = (targets,)
    modules_to_save = tuple(raw.get("modules_to_save") or ())
    use_dora = bool(raw.get("use_dora", False))
    bias = str(raw.get("bias", "none") or "none")

    problems: list[str] = []
    if rank > VLLM_RANKS[-1]:
        problems.append(
            f"rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_RANKS[-1]}; retrain at <= {VLLM_RANKS[-1]}"
        )
    if use_dora:
        problems.append("use_dora=true: vLLM does not serve DoRA adapters; retrain without DoRA")
    if bias != "none":
        problems.append(f"bias={bias!r}: vLLM only serves adapters with bias='none'; retrain with bias='none'")
    if unsupported := sorted(set(modules_to_save) - _ALLOWED_MODULES_TO_SAVE):
        problems.append(f"modules_to_save={unsupported}: vLLM cannot load these; keep only embed_tokens/lm_head")
    alpha = raw.get("lora_alpha", r)
    return AdapterConfig(
        rank=rank,
        lora_alpha=float(alpha) if isinstance(alpha, int | float) else float(r),
        target_modules=tuple(str(t) for t in targets),
        base_model=raw.get("base_model_name_or_path") or None,
        use_dora=use_dora,
        bias=bias,
        modules_to_save=modules_to_save,
        problems=tuple(problems),
        r=r,
        rank_pattern=tuple((str(k), v) for k, v in pattern.items()),
    )


def vllm_rank_for(rank: int) -> int:
    """The smallest rank vLLM accepts for --max-lora-rank that holds ``rank``."""
    for allowed in VLLM_RANKS:
        if allowed >= rank:
            return allowed
    raise AdapterError(
        f"rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_RANKS[-1]}; retrain at <= {VLLM_RANKS[-1]}"
    )


def same_base_model(expected: str, actual: str | None) -> bool:
    """True when an adapter's base_model_name_or_path names the pool's base model.

    Adapters often record a local path or a different casing; compare the last two
    path segments case-insensitively (``/models/meta-llama/Llama-3-8B`` matches
    ``meta-llama/llama-3-8b``). An adapter that records nothing is not a mismatch.
    """
    if not actual:
        return True

    def tail(name: str) -> str:
        parts = [p for p in name.strip().rstrip("/").replace("hf://", "").split("/") if p]
        return "/".join(parts[-2:]).lower()

    return tail(expected) == tail(actual) or tail(expected).split("/")[-1] == tail(actual).split("/")[-1]
