"""An adapter: its inline form in a pool (``AdapterSpec``) and the LoRAAdapter resource. Pure.

``api.pool`` lists inline adapters as ``AdapterSpec``; a LoRAAdapter (one team's adapter,
attached to a pool by ``spec.poolRef``) shares its field rules and turns into the inline
form with ``as_adapter()``, so the planner and the controller treat both alike.
``api.crd`` generates the LoRAAdapter CRD from ``LoRAAdapterSpec``; ``api.models``
re-exports these names.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from lorapool.api.common import ADAPTER_SOURCE, REVISION, SHA256
from lorapool.api.fields import ADAPTER_NAME, API_VERSION, POOL_NAME, ObjectMeta, Spec, Wire
from lorapool.api.traffic import AdapterTraffic

RankValue = Annotated[int, Field(ge=1, le=512)]


class AdapterSpec(Wire):
    """One LoRA adapter served by the pool."""

    name: Annotated[str, ADAPTER_NAME] = Field(
        max_length=63,
        description='Adapter id clients send as "model"; a DNS-1123 label.',
    )
    source: Annotated[str, ADAPTER_SOURCE] = Field(
        max_length=1024,
        description="PEFT adapter location: hf://org/repo, s3://bucket/prefix/, https://host/adapter.tar.gz, pvc://claim/path, "
        "file:///path or oci://registry/repository:tag (best pinned: ...@sha256:digest).",
    )
    revision: Annotated[str, REVISION] | None = Field(
        default=None, max_length=128, description="Revision (hf branch/tag/commit); a change hot-swaps the adapter."
    )
    rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        examples=[16],
        description="LoRA rank r (largest of r and rank_pattern); read from adapter_config.json when omitted.",
    )
    sha256: Annotated[str, SHA256] | None = Field(
        default=None,
        max_length=64,
        description="Expected sha256 (archive bytes, or adapter_model.safetensors for directories).",
    )
    traffic: AdapterTraffic | None = Field(
        default=None,
        description="How the router treats this adapter's requests: priority (critical, standard, sheddable) and "
        "rate limits for the whole pool (429 with Retry-After over them); default: standard, no limits.",
    )


class PoolRef(Wire):
    """The LoRAPool (same namespace) an adapter joins."""

    name: Annotated[str, POOL_NAME] = Field(max_length=40)


class LoRAAdapterSpec(Wire):
    """One adapter owned by one team, attached to a pool; its id is metadata.name."""

    pool_ref: PoolRef = Field(description="The pool that serves this adapter.")
    source: Annotated[str, ADAPTER_SOURCE] = Field(
        max_length=1024, description=AdapterSpec.model_fields["source"].description
    )
    revision: Annotated[str, REVISION] | None = Field(
        default=None, max_length=128, description=AdapterSpec.model_fields["revision"].description
    )
    rank: int | None = Field(
        default=None, ge=1, le=512, examples=[16], description=AdapterSpec.model_fields["rank"].description
    )
    sha256: Annotated[str, SHA256] | None = Field(
        default=None, max_length=64, description=AdapterSpec.model_fields["sha256"].description
    )
    traffic: AdapterTraffic | None = Field(default=None, description=AdapterSpec.model_fields["traffic"].description)


class AdapterMeta(ObjectMeta):
    """LoRAAdapter names are adapter ids, so they must be DNS-1123 labels."""

    name: Annotated[str, ADAPTER_NAME] = Field(max_length=63)


class LoRAAdapter(Spec):
    """A LoRAAdapter resource as read from YAML or the API server."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: Literal["lorapool.io/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["LoRAAdapter"] = "LoRAAdapter"
    metadata: AdapterMeta
    spec: LoRAAdapterSpec

    def as_adapter(self) -> AdapterSpec:
        """The inline form, so pools treat both kinds of adapters the same way."""
        return AdapterSpec(
            name=self.metadata.name,
            source=self.spec.source,
            revision=self.spec.revision,
            rank=self.spec.rank,
            sha256=self.spec.sha256,
            traffic=self.spec.traffic,
        )
