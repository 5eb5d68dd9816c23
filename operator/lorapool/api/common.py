"""Patterns, readable string rules and vocabularies shared by the API models, the CRD schema and the sidecar.

The source rules (``ADAPTER_SOURCE``, ``BASE_MODEL_SOURCE``, ``SOURCE_PATTERN``) are built from the
scheme table, ``lorapool.api.schemes``. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from lorapool.api.schemes import SCHEMES, Scheme, UriRule

# DNS-1123 label, so an adapter name is safe as a path segment, a label value and a model id.
ADAPTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Sources as the adapter set's wire contract accepts them: each scheme's URI pattern (lorapool.api.schemes).
# pvc://claim/path and file:///abs/path name local directories.
SOURCE_PATTERN = "^(" + "|".join(s.uri_pattern for s in SCHEMES) + ")$"
BASE_MODEL_SOURCE_PATTERN = (
    "^(" + "|".join(s.base_model.uri_pattern for s in SCHEMES if s.base_model is not None) + ")$"
)
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

# --- source rules: one per scheme, from the scheme table (lorapool.api.schemes) ------------------


def _scheme_rule(rule: UriRule) -> Check:
    return Check(rule.regex, rule.message, when=rule.when)


def _source_rules(entries: Sequence[tuple[Scheme, UriRule]]) -> Checked:
    """A source's rules: it starts with the prefix of one of ``entries`` (the message's example is the
    first entry's), then each entry's own rule, in the table's order."""
    *most, last = (scheme.prefix for scheme, _ in entries)
    starts = Check(
        f"^({'|'.join(scheme.scheme_regex for scheme, _ in entries)})://",
        f"must start with {', '.join(most)} or {last}, e.g. {entries[0][1].example}",
    )
    return Checked((starts, *(_scheme_rule(rule) for _, rule in entries)))


ADAPTER_SOURCE = _source_rules([(s, s.adapter) for s in SCHEMES])
BASE_MODEL_SOURCE = _source_rules([(s, s.base_model.rule) for s in SCHEMES if s.base_model is not None])

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
