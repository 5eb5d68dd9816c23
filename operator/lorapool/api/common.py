"""Patterns, readable string rules and vocabularies shared by the API models, the CRD schema and the sidecar."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

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


class FrontDoor(StrEnum):
    """How requests reach the pool (docs/gateway.md): one policy, two doors."""

    ROUTER = "router"  # the pool's own HTTP router Service
    GATEWAY = "gateway"  # a Gateway API Inference Extension gateway, through an InferencePool and its picker
    BOTH = "both"


class FailureMode(StrEnum):
    """InferencePool endpointPickerRef.failureMode: what the gateway does when the picker does not answer."""

    FAIL_CLOSE = "FailClose"
    FAIL_OPEN = "FailOpen"


# --- readable string rules -------------------------------------------------------------------
#
# A string field's rules are written once, as ``Check``s: pydantic applies them offline
# (`lorapool plan`), and the CRD carries each as a CEL rule with the same message, so the API
# server and the CLI refuse the same input with the same words. A JSON-schema ``pattern`` would
# make the API server print the regular expression itself, which nobody can read.


@dataclass(frozen=True)
class Check:
    """One rule a string must follow: ``regex`` (RE2 and Python alike) must match (or, with
    ``absent``, must not), for values starting with ``when``; ``message`` says what a valid
    value looks like, with an example."""

    regex: str
    message: str
    when: str = ""
    absent: bool = False

    def holds(self, value: str) -> bool:
        if not value.startswith(self.when):
            return True
        return (re.search(self.regex, value) is None) if self.absent else (re.search(self.regex, value) is not None)

    def cel(self) -> str:
        test = f"self.matches(r'{self.regex}')"
        test = f"!{test}" if self.absent else test
        return f"!self.startsWith('{self.when}') || {test}" if self.when else test


@dataclass(frozen=True)
class Checked:
    """``Annotated[str, Checked(...)]``: validate with these checks, publish them as CEL rules."""

    checks: tuple[Check, ...]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        def validate(value: str) -> str:
            failed = [c.message for c in self.checks if not c.holds(value)]
            if failed:
                raise PydanticCustomError("checked", "{message}", {"message": "; ".join(failed)})
            return value

        return core_schema.no_info_after_validator_function(validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        out["x-kubernetes-validations"] = [{"rule": c.cel(), "message": c.message} for c in self.checks]
        return out


def dns_label(example: str) -> Checked:
    return Checked(
        (
            Check(
                ADAPTER_NAME_PATTERN,
                "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter "
                f"or digit, e.g. {example}",
            ),
        )
    )


DNS_SUBDOMAIN = Checked(
    (
        Check(
            DNS1123_SUBDOMAIN_PATTERN,
            "must be a Kubernetes object name: lowercase letters, digits, '-' and '.', e.g. hf-token",
        ),
    )
)

_SCHEMES_ADAPTER = "hf://, s3://, https://, pvc:// or file://"
_S3 = Check(
    r"^s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?$",
    "an s3:// source is s3://<bucket>/<prefix>, the bucket 3-63 lowercase letters, digits, '-' or '.', starting "
    "and ending with a letter or digit, e.g. s3://acme-adapters/sql-coder/",
    when="s3://",
)
_PVC = Check(
    r"^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?$",
    "a pvc:// source is pvc://<claim>/<path>, the claim a Kubernetes name (lowercase letters, digits, '-', '.'), "
    "e.g. pvc://adapters/sql-coder",
    when="pvc://",
)
_FILE = Check(r"^file:///", "a file:// source is an absolute path, e.g. file:///adapters/sql-coder", when="file://")

ADAPTER_SOURCE = Checked(
    (
        Check(
            r"^(hf|s3|https?|pvc|file)://",
            f"must start with {_SCHEMES_ADAPTER}, e.g. hf://acme/llama3-sql-lora",
        ),
        Check(
            r"^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(@[-A-Za-z0-9_./]+)?(/.*)?$",
            "an hf:// source is hf://<org>/<repo>, optionally @<revision> and /<subfolder>, "
            "e.g. hf://acme/llama3-sql-lora",
            when="hf://",
        ),
        _S3,
        Check(
            r"^https?://[^\s/]+\S*$",
            "an https:// source is a URL without spaces, of a .tar.gz archive or a directory, "
            "e.g. https://models.example.com/sql-coder.tar.gz",
            when="http",
        ),
        _PVC,
        _FILE,
    )
)

BASE_MODEL_SOURCE = Checked(
    (
        Check(
            r"^(hf|s3|pvc|file)://",
            "must start with hf://, s3://, pvc:// or file://, e.g. hf://meta-llama/Meta-Llama-3-8B-Instruct",
        ),
        Check(
            r"^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$",
            "an hf:// base model is hf://<org>/<repo> (its revision goes in spec.baseModel.revision), "
            "e.g. hf://meta-llama/Meta-Llama-3-8B-Instruct",
            when="hf://",
        ),
        _S3,
        _PVC,
        _FILE,
    )
)

SHA256 = Checked(
    (
        Check(
            SHA256_PATTERN,
            "must be 64 lowercase hex digits as sha256sum prints them, "
            "e.g. 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        ),
    )
)

REVISION = Checked(
    (
        Check(
            r"^[A-Za-z0-9][-A-Za-z0-9_./]*$",
            "must be a branch, tag or commit: letters, digits, '-', '_', '.' and '/', starting with a letter or "
            "digit, e.g. main, v1.2 or a 40-hex commit",
        ),
        Check(r"\.\.", "must not contain '..', e.g. main, v1.2 or a 40-hex commit", absent=True),
    )
)

HTTP_URL = Checked((Check(r"^https?://[^\s/]+\S*$", "must be an http(s) URL, e.g. https://minio.example:9000"),))
