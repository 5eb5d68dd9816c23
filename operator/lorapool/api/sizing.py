"""``spec.lora``: vLLM's LoRA sizing (--max-loras, --max-lora-rank, --max-cpu-loras) and its loop. Pure.

Each value is a number or 'auto', which the planner (``plan.planner``) derives from the
adapters' ranks and the GPU; ``SizingTuning`` is the opt-in loop that ``controller.tuning``
runs to apply status.recommendation. Used by ``api.pool``; ``api.models`` re-exports the names.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, ValidatorFunctionWrapHandler, field_validator, model_validator
from pydantic_core import InitErrorDetails

from lorapool.api.common import Dtype
from lorapool.api.fields import (
    AUTO,
    AUTO_OR_POSITIVE,
    IntOrAuto,
    Wire,
    cel,
    custom_error,
    int_or_auto_schema,
    validate_reporting_all,
)
from lorapool.api.peft import VLLM_RANKS

_RANKS_CEL = "[" + ", ".join(map(str, VLLM_RANKS)) + "]"
_LORA_CEL = cel(
    (
        "!has(self.maxLoras) || !has(self.maxCpuLoras) || type(self.maxLoras) == string "
        "|| type(self.maxCpuLoras) == string || self.maxCpuLoras >= self.maxLoras",
        "maxCpuLoras must be >= maxLoras (vLLM refuses to start otherwise): set maxCpuLoras >= maxLoras or 'auto'",
    ),
    (
        "!has(self.tuning) || !has(self.tuning.apply) || !self.tuning.apply || !has(self.maxLoras) "
        "|| type(self.maxLoras) == string",
        "maxLoras must be 'auto' when tuning.apply is true (an explicit maxLoras wins over the sizing loop): "
        "set maxLoras to 'auto' or tuning.apply to false",
    ),
)


class SizingTuning(Wire):
    """The closed sizing loop: how status.recommendation's --max-loras is applied (opt-in)."""

    apply: bool = Field(
        default=False,
        description="Apply status.recommendation.maxLoras to the engines (rolls the engine pods); "
        "false = recommend only. Needs maxLoras 'auto'.",
    )
    min_period_seconds: int = Field(
        default=1800,
        ge=60,
        le=7 * 86400,
        description="At most one change (or rollback) per this many seconds.",
    )
    max_step_factor: float = Field(
        default=2.0,
        ge=1.1,
        le=8.0,
        description="One change moves maxLoras at most by this factor up or down (bounded steps).",
    )
    rollback_margin: float = Field(
        default=0.10,
        ge=0.0,
        le=1.0,
        description="Roll a change back when, over an equal window after it, p99 TTFT is higher or goodput "
        "lower than before by more than this fraction.",
    )


class ReplanPolicy(StrEnum):
    """Who lets a plan change restart the engines: the operator, or a person (or GitOps) approving it."""

    AUTOMATIC = "Automatic"
    APPROVAL = "Approval"


class Replan(Wire):
    """When a changed plan (vLLM's LoRA flags are fixed at start) may restart the engine pods.

    A bulk apply changes the catalogue many times in seconds; each plan of a catalogue still arriving
    would be one more roll of every GPU pod, so the derivation waits for it to settle first."""

    settle_seconds: int = Field(
        default=10,
        ge=0,
        le=3600,
        description="A plan change that restarts the engines waits until the adapters (LoRAAdapters and inline) "
        "have not changed for this many seconds, keeping the running flags meanwhile; a new pool's first engine "
        "template waits the same while its adapters arrive. 0 = no wait.",
    )
    policy: ReplanPolicy = Field(
        default=ReplanPolicy.AUTOMATIC,
        description="Automatic: a plan change that restarts the engines is announced (condition "
        "EngineRestartPending, Event) and then applied. Approval: it is announced and held until the pool "
        "carries the annotation lorapool.io/approve-plan=<the hash the condition names>.",
    )


class LoraSpec(Wire):
    """vLLM LoRA sizing. 'auto' derives each value from the adapters' real ranks and the GPU."""

    model_config = ConfigDict(json_schema_extra=_LORA_CEL)

    max_loras: IntOrAuto = Field(
        default=AUTO,
        description="GPU adapter slots (vLLM --max-loras): most distinct adapters in one batch. 'auto' or a number.",
        json_schema_extra=int_or_auto_schema("maxLoras", AUTO_OR_POSITIVE, "must be 'auto' or an integer >= 1, e.g. 8"),
    )
    max_lora_rank: IntOrAuto = Field(
        default=AUTO,
        description="vLLM --max-lora-rank: 'auto' (smallest allowed rank >= the largest adapter rank) or one of 1, 8, 16, 32, 64, 128, 256, 320, 512.",
        json_schema_extra=int_or_auto_schema(
            "maxLoraRank",
            f"type(self) == string ? self == 'auto' : self in {_RANKS_CEL}",
            "must be 'auto' or one of vLLM's ranks 1, 8, 16, 32, 64, 128, 256, 320, 512",
        ),
    )
    max_cpu_loras: IntOrAuto = Field(
        default=AUTO,
        description="vLLM --max-cpu-loras (CPU LRU cache of adapters): 'auto' (as many adapters of maxLoraRank as the engine container's memory holds after weights and runtime, at least maxLoras; not the adapter count) or a number >= maxLoras.",
        json_schema_extra=int_or_auto_schema(
            "maxCpuLoras", AUTO_OR_POSITIVE, "must be 'auto' or an integer >= 1, e.g. 32"
        ),
    )
    dtype: Dtype = Field(default=Dtype.AUTO, description="vLLM --lora-dtype.")
    target_modules: list[str] | None = Field(
        default=None, description="vLLM --lora-target-modules: restricts LoRA buffers to these modules."
    )
    min_kv_cache_sequences: int = Field(
        default=4,
        ge=1,
        le=4096,
        description="auto maxLoras keeps the KV cache able to hold at least this many maxModelLen sequences.",
    )
    min_kv_cache_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=0.95,
        description="auto maxLoras never lets LoRA buffers take more than 1-this of the memory the KV cache would have had.",
    )
    headroom_kv_cache_fraction: float = Field(
        default=0.05,
        ge=0.0,
        le=0.5,
        description="auto maxLoras adds spare slots above the adapter count (so adding an adapter does not restart "
        "pods) only while all spares together cost at most this fraction of the KV cache; 0 = a slot per adapter.",
    )
    tuning: SizingTuning | None = Field(
        default=None,
        description="The sizing loop: status.recommendation is always written; tuning.apply applies it.",
    )
    replan: Replan = Field(
        default_factory=Replan,
        description="When a plan change that restarts the engine pods happens: after the catalogue settles, "
        "announced first, optionally held for approval (docs/sizing.md).",
    )

    @field_validator("max_loras", "max_cpu_loras", mode="before")
    @classmethod
    def _int_or_auto(cls, value: Any) -> Any:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be 'auto' or an integer >= 1, e.g. 8 (got {value!r})")

    @field_validator("max_lora_rank", mode="before")
    @classmethod
    def _vllm_rank(cls, value: Any) -> Any:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value in VLLM_RANKS):
            return value
        allowed = ", ".join(map(str, VLLM_RANKS))
        raise ValueError(f"{value!r} is not a vLLM rank; use 'auto' or one of {allowed}")

    @model_validator(mode="wrap")
    @classmethod
    def _cpu_holds_gpu(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> LoraSpec:
        """maxCpuLoras >= maxLoras, reported beside the other fields' problems, not instead of them."""
        raw = value if isinstance(value, dict) else {}
        gpu, cpu = raw.get("maxLoras", raw.get("max_loras")), raw.get("maxCpuLoras", raw.get("max_cpu_loras"))
        problems: list[InitErrorDetails] = []
        if isinstance(gpu, int) and isinstance(cpu, int) and not isinstance(gpu | cpu, bool) and 1 <= cpu < gpu:
            message = f"maxCpuLoras={cpu} is below maxLoras={gpu}; vLLM refuses to start: set maxCpuLoras >= maxLoras or 'auto'"
            problems.append({"type": custom_error("value_error", message), "loc": (), "input": value})
        tuning = raw.get("tuning")
        if isinstance(tuning, dict) and tuning.get("apply") is True and isinstance(gpu, int):
            message = (
                f"tuning.apply needs maxLoras 'auto' (maxLoras={gpu} wins over the sizing loop): "
                "set maxLoras to 'auto' or tuning.apply to false"
            )
            problems.append({"type": custom_error("value_error", message), "loc": (), "input": value})
        result: LoraSpec = validate_reporting_all(handler, value, problems, cls.__name__)
        return result
