"""The desired adapter set: what the operator writes to ConfigMap ``<pool>-adapters``
(key ``adapters.json``) and what every adapter-sync sidecar reads. Pure data.

It is the only contract between the operator and the sidecar, so it is versioned
(``apiVersion``/``kind``) and strict: unknown fields are refused, not ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lorapool.api.common import ADAPTER_NAME_PATTERN, SHA256_PATTERN, SOURCE_PATTERN

CONFIGMAP_KEY = "adapters.json"
ADAPTERSET_API_VERSION = "lorapool.io/v1alpha1"


class DesiredAdapter(BaseModel):
    """One adapter the engine should have loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=ADAPTER_NAME_PATTERN, max_length=63)
    source: str = Field(pattern=SOURCE_PATTERN)
    revision: str | None = None
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)
    rank: int | None = Field(default=None, ge=1)
    # The replica slots placed to hold it (docs/placement.md); absent: every replica.
    replicas: tuple[int, ...] | None = None

    def placed_on(self, slot: int | None) -> bool:
        """True when the replica in ``slot`` should hold it; a replica with no slot yet holds only what is everywhere."""
        return self.replicas is None or (slot is not None and slot in self.replicas)


class AdapterSet(BaseModel):
    """The whole desired set for one pool; the sidecar converges the engine to it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str = Field(default=ADAPTERSET_API_VERSION, alias="apiVersion")
    kind: str = Field(default="AdapterSet")
    pool: str
    base_model: str = Field(alias="baseModel")
    max_lora_rank: int = Field(alias="maxLoraRank", ge=1)
    adapters: tuple[DesiredAdapter, ...] = ()

    def share(self, slot: int | None) -> AdapterSet:
        """The set one replica converges to: adapters placed everywhere plus those placed on ``slot``."""
        return self.model_copy(update={"adapters": tuple(a for a in self.adapters if a.placed_on(slot))})

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> AdapterSet:
        return cls.model_validate_json(text)
