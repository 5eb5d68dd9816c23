"""A CustomResourceDefinition of GIE's InferencePool v1, for tests and the playground (no network).

Written here from the fields, limits and CEL rules of the Gateway API Inference Extension's
``api/v1/inferencepool_types.go`` (and ``shared_types.go``), not copied from its generated CRD:
the real API server then accepts and refuses InferencePools as a cluster with GIE installed does.
Users install GIE's own release manifests (docs/gateway.md); this file is never applied to theirs.
"""

from __future__ import annotations

from typing import Any

from lorapool.controller.gateway import INFERENCE_POOL_KIND, PLURAL
from lorapool.render import names

NAME = f"{PLURAL}.{names.INFERENCE_POOL_GROUP}"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def _string(pattern: str | None = None, min_length: int = 1, max_length: int = 253) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "minLength": min_length, "maxLength": max_length}
    return {**out, "pattern": pattern} if pattern else out


def _port() -> dict[str, Any]:
    number = {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535}
    return {"type": "object", "required": ["number"], "properties": {"number": number}}


def _endpoint_picker_ref() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name"],
        "properties": {
            "group": {**_string(_GROUP, min_length=0), "default": ""},
            "kind": {**_string(_KIND, max_length=63), "default": "Service"},
            "name": _string(),
            "port": _port(),
            "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"], "default": "FailClose"},
        },
        "x-kubernetes-validations": [
            {
                "rule": "self.kind != 'Service' || has(self.port)",
                "message": "port is required when kind is 'Service' or unspecified (defaults to 'Service')",
            }
        ],
    }


def _spec() -> dict[str, Any]:
    match_labels = {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 64,
        "additionalProperties": _string(_LABEL_VALUE, min_length=0, max_length=63),
        "x-kubernetes-validations": [
            {"rule": f"self.all(k, k.matches(r'{_LABEL_KEY}') && size(k) <= 253)", "message": "invalid label key"}
        ],
    }
    return {
        "type": "object",
        "required": ["selector", "targetPorts"],
        "properties": {
            "selector": {"type": "object", "required": ["matchLabels"], "properties": {"matchLabels": match_labels}},
            "targetPorts": {
                "type": "array",
                "minItems": 1,
                "maxItems": 8,
                "items": _port(),
                "x-kubernetes-list-type": "atomic",
                "x-kubernetes-validations": [
                    {
                        "rule": "self.all(p1, self.exists_one(p2, p1.number==p2.number))",
                        "message": "port number must be unique",
                    }
                ],
            },
            "appProtocol": {"type": "string", "enum": ["http", "kubernetes.io/h2c"], "default": "http"},
            "endpointPickerRef": _endpoint_picker_ref(),
        },
    }


def _status() -> dict[str, Any]:
    condition = {
        "type": "object",
        "required": ["type", "status", "lastTransitionTime", "reason", "message"],
        "properties": {
            "type": _string(max_length=316),
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "reason": _string(max_length=1024),
            "message": {"type": "string", "maxLength": 32768},
        },
    }
    parent_ref = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "group": {**_string(_GROUP, min_length=0), "default": "gateway.networking.k8s.io"},
            "kind": {**_string(_KIND, max_length=63), "default": "Gateway"},
            "name": _string(),
            "namespace": _string(_DNS_LABEL, max_length=63),
        },
    }
    parent = {
        "type": "object",
        "required": ["parentRef"],
        "properties": {
            "conditions": {
                "type": "array",
                "maxItems": 8,
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "parentRef": parent_ref,
            "controllerName": _string(),
        },
    }
    parents = {"type": "array", "maxItems": 32, "items": parent, "x-kubernetes-list-type": "atomic"}
    return {"type": "object", "properties": {"parents": parents}}


def inferencepool_crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec(),
            "status": _status(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        # *.k8s.io groups are protected: the API server wants the approval GIE's CRD carries (its API review PR).
        "metadata": {
            "name": NAME,
            "annotations": {
                "api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api-inference-extension/pull/1173"
            },
        },
        "spec": {
            "group": names.INFERENCE_POOL_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": INFERENCE_POOL_KIND,
                "listKind": f"{INFERENCE_POOL_KIND}List",
                "plural": PLURAL,
                "singular": "inferencepool",
                "shortNames": ["infpool"],
            },
            "versions": [
                {
                    "name": names.INFERENCE_POOL_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
