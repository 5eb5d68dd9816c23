"""Generate the CustomResourceDefinitions from the pydantic models. Pure.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema:
no ``$ref``, no ``anyOf`` for nullability, no ``additionalProperties: false``
beside ``properties``, ``x-kubernetes-int-or-string`` for int-or-'auto' fields.
``structural()`` turns one into the other; ``crds()`` adds the CRD envelope
(subresources, printer columns, short names). ``lorapool crds`` writes the result
to ``crds/`` and a test fails when the checked-in files are stale.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from lorapool.api.models import GROUP, VERSION, LoRAAdapterSpec, LoRAPoolSpec
from lorapool.api.status import LoRAAdapterStatus, LoRAPoolStatus

_DROP = {"title", "additionalProperties_false", "examples"}


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model, every ``$ref`` inlined."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = _convert(target, defs)
        # Field-level description and extras win over the referenced class's docstring.
        merged.update({k: v for k, v in _convert(node, defs).items() if k != "type" or "type" not in merged})
        return merged
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = _convert(node.pop("allOf")[0], defs)
        return {**inner, **_convert(node, defs)}
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if node.get("x-kubernetes-int-or-string"):
            node.pop("default", None) if node.get("default") is None else None
            result = {k: v for k, v in node.items() if k not in _DROP}
            return result
        if len(branches) != 1:
            raise ValueError(f"cannot express union {branches} in a structural schema")
        inner = _convert(branches[0], defs)
        if node.get("default") is None:
            node.pop("default", None)
        return {**inner, **_convert(node, defs)}

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties":
            if value is True:  # dict[str, Any]: arbitrary content, kept as written
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = _convert(value, defs)
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema's numeric form; OpenAPI v3.0 wants the bound plus a boolean flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "default":
            if isinstance(value, dict | list) or value is None:
                continue  # object defaults would freeze today's nested defaults into stored objects
            out[key] = value
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        kinds = {type(v) for v in out["enum"]}
        out["type"] = "integer" if kinds == {int} else "string"
    if "properties" in out:
        out["type"] = "object"
    return out


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def _resource_schema(
    spec: type[BaseModel], status: type[BaseModel], description: str, root_rules: list[dict[str, str]]
) -> dict[str, Any]:
    # No defaults under status: the API server would add them to what the operator writes,
    # and the next resync would see a difference where there is none.
    status_schema = _without_defaults(structural(status))
    # kopf and other controllers may add their own bookkeeping under status.
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    spec_schema = structural(spec)
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "lorapool.io/v1alpha1"},
            "kind": {"type": "string", "description": "The resource kind."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": root_rules,
    }


def _crd(
    kind: str, plural: str, short: str, schema: dict[str, Any], columns: list[dict[str, Any]], scale: bool
) -> dict[str, Any]:
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "lorapool", "app.kubernetes.io/part-of": "lorapool"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": [
                    "ai"
                ],  # not "lorapool": a category equal to the singular shadows `kubectl get lorapool NAME`
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _ready_column() -> dict[str, Any]:
    return {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'}


def lorapool_crd() -> dict[str, Any]:
    schema = _resource_schema(
        LoRAPoolSpec,
        LoRAPoolStatus,
        "LoRAPool serves a base model on vLLM replicas with many LoRA adapters, "
        "vLLM LoRA flags derived from the adapters' ranks and the GPU, and an adapter-aware router.",
        [
            {
                "rule": "size(self.metadata.name) <= 40",
                "message": "metadata.name must be at most 40 characters: child objects append suffixes such as -engine",
            }
        ],
    )
    columns = [
        {"name": "Base", "type": "string", "jsonPath": ".spec.baseModel.name"},
        {"name": "Adapters", "type": "integer", "jsonPath": ".status.adapterCount"},
        _ready_column(),
        {"name": "Replicas", "type": "string", "jsonPath": ".status.readyReplicas", "description": "Ready engine pods"},
        {"name": "MaxLoRAs", "type": "integer", "jsonPath": ".status.plan.maxLoras"},
        {"name": "Rank", "type": "integer", "jsonPath": ".status.plan.maxLoraRank"},
        {
            "name": "vLLM",
            "type": "string",
            "jsonPath": ".status.engineVersions[*].version",
            "description": "vLLM releases the Ready engines run",
        },
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd("LoRAPool", "lorapools", "lp", schema, columns, scale=True)


def loraadapter_crd() -> dict[str, Any]:
    schema = _resource_schema(
        LoRAAdapterSpec,
        LoRAAdapterStatus,
        "LoRAAdapter adds one LoRA adapter to a LoRAPool (spec.poolRef); its metadata.name is the "
        'adapter id clients send as "model". Lets teams add adapters without editing the pool.',
        [
            {
                "rule": "size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                "message": "metadata.name is the adapter id and must be a DNS-1123 label (lowercase letters, digits, '-'; at most 63)",
            }
        ],
    )
    columns = [
        {"name": "Pool", "type": "string", "jsonPath": ".spec.poolRef.name"},
        {"name": "Rank", "type": "integer", "jsonPath": ".status.rank"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        _ready_column(),
        {"name": "Loaded", "type": "integer", "jsonPath": ".status.loadedReplicas"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd("LoRAAdapter", "loraadapters", "la", schema, columns, scale=False)


def crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD object, as written to ``crds/``."""
    return {
        f"{GROUP}_lorapools.yaml": lorapool_crd(),
        f"{GROUP}_loraadapters.yaml": loraadapter_crd(),
    }
