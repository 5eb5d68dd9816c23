"""``spec.placement``: on how many replicas (k of N) each adapter lives, and per-adapter overrides. Pure.

The spec only: ``plan`` computes from it which replicas hold each adapter. Used by
``api.pool``; ``api.models`` re-exports the names.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from lorapool.api.fields import ADAPTER_NAME, AUTO, AUTO_OR_POSITIVE, IntOrAuto, Wire, cel, int_or_auto_schema

ALL: Final = "all"


class PlacementOverride(Wire):
    """Where one adapter lives whatever its load, e.g. a critical adapter pinned to every replica."""

    name: Annotated[str, ADAPTER_NAME] = Field(max_length=63, description="The adapter (inline or LoRAAdapter).")
    replicas: int | Literal["all"] = Field(
        description="'all' (every replica: pinned) or a number of replicas (clipped to the pool's size).",
        # maxLength bounds the CEL cost of the string case (1000 overrides x an unbounded string exceeds the budget).
        json_schema_extra={
            **int_or_auto_schema(
                "replicas",
                "type(self) == string ? self == 'all' : self >= 1",
                "must be 'all' or an integer >= 1, e.g. 2",
            ),
            "maxLength": 3,
        },
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _all_or_positive(cls, value: Any) -> Any:
        if value == ALL or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be 'all' or an integer >= 1, e.g. 2 (got {value!r})")


_PLACEMENT_CEL = cel(
    (
        "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        "minReplicas must be <= maxReplicas: lower minReplicas or raise maxReplicas",
    ),
)


class PlacementSpec(Wire):
    """On how many replicas (k of N) each adapter lives; docs/placement.md.

    'auto' keeps every adapter on every replica while each replica's CPU cache (maxCpuLoras)
    holds the whole catalog, as small pools always did; past that, each adapter gets k replicas
    chosen by rendezvous hashing over stable replica slots, k following its load.
    """

    model_config = ConfigDict(json_schema_extra=_PLACEMENT_CEL)

    replicas_per_adapter: IntOrAuto = Field(
        default=AUTO,
        description="'auto' (every replica while the catalog fits each replica's maxCpuLoras, else k from each "
        "adapter's load within minReplicas..maxReplicas) or a number of replicas for every adapter.",
        json_schema_extra=int_or_auto_schema(
            "replicasPerAdapter", AUTO_OR_POSITIVE, "must be 'auto' or an integer >= 1, e.g. 2"
        ),
    )
    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest replicas an adapter gets under 'auto'.")
    max_replicas: int | None = Field(
        default=None, ge=1, le=1000, description="Most replicas an adapter gets under 'auto'; default: the pool's size."
    )
    scale_down_cooldown_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="Under 'auto', an adapter gives up a replica only this long after its last change (hysteresis).",
    )
    overrides: list[PlacementOverride] = Field(
        default_factory=list,
        max_length=1000,
        description="Per-adapter replicas that win over replicasPerAdapter, e.g. {name: sql-coder, replicas: all}.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("replicas_per_adapter", mode="before")
    @classmethod
    def _auto_or_positive(cls, value: Any) -> Any:
        if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"must be 'auto' or an integer >= 1, e.g. 2 (got {value!r})")

    @model_validator(mode="after")
    def _bounds(self) -> PlacementSpec:
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas={self.min_replicas} is above maxReplicas={self.max_replicas}; "
                "lower minReplicas or raise maxReplicas"
            )
        seen: set[str] = set()
        for i, o in enumerate(self.overrides):
            if o.name in seen:
                raise ValueError(f"overrides[{i}].name: {o.name!r} is listed twice; keep one entry per adapter")
            seen.add(o.name)
        return self
