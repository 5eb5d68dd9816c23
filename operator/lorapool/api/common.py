"""Patterns and vocabularies shared by the API models, the CRD schema and the sidecar."""

from __future__ import annotations

from enum import StrEnum

# DNS-1123 label, so an adapter name is safe as a path segment, a label value and a model id.
ADAPTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Adapter sources. pvc://claim/path and file:///abs/path name local directories.
SOURCE_PATTERN = r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(@[-A-Za-z0-9_./]+)?(/.*)?|s3://[a-z0-9][-a-z0-9.]{1,62}(/.*)?|https?://[^\s]+|pvc://[a-z0-9][-a-z0-9.]*(/.*)?|file:///.*)$"
BASE_MODEL_SOURCE_PATTERN = r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+|s3://[a-z0-9][-a-z0-9.]{1,62}(/.*)?|pvc://[a-z0-9][-a-z0-9.]*(/.*)?|file:///.*)$"
SHA256_PATTERN = r"^[a-f0-9]{64}$"


class Dtype(StrEnum):
    """Weight / LoRA dtype as vLLM spells it."""

    AUTO = "auto"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class RouterPolicy(StrEnum):
    """How the router picks a replica for a request."""

    AFFINITY = "affinity"
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
