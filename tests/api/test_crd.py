"""The checked-in CRDs are what the models generate, and they are valid apiextensions/v1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.crd import crds
from lorapool.api.yamlio import dump

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def test_checked_in_crds_are_not_stale() -> None:
    for name, crd in crds().items():
        assert (CRD_DIR / name).read_text() == dump(crd), f"crds/{name} is stale: run `lorapool crds`"


def _walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(crds()))
def test_schema_is_structural(name: str) -> None:
    crd = crds()[name]
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = json.dumps(schema)
    for forbidden in ('"$ref"', '"anyOf"', '"allOf"', '"oneOf"', '"null"', '"title"'):
        assert forbidden not in text, f"{forbidden} is not allowed in a structural schema"
    for path, node in _walk(schema):
        has_type = "type" in node
        assert has_type or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"), (
            path
        )
        if "properties" in node:
            assert node["type"] == "object", path
            assert node.get("additionalProperties") in (None,), path


def test_crds_are_valid_apiextensions_v1() -> None:
    import kubernetes_validate

    for crd in crds().values():
        kubernetes_validate.validate(crd, "1.36.0", strict=True)


def test_pool_crd_has_scale_status_columns_and_short_name() -> None:
    crd = crds()["lorapool.io_lorapools.yaml"]
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["lp"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {
        "Base",
        "Adapters",
        "Ready",
        "MaxLoRAs",
        "Rank",
        "Age",
    }
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    adapters = spec["properties"]["adapters"]
    assert adapters["x-kubernetes-list-type"] == "map" and adapters["x-kubernetes-list-map-keys"] == ["name"]
    assert adapters["items"]["properties"]["rank"]["maximum"] == 512
    rules = " ".join(r["rule"] for r in spec["properties"]["lora"]["x-kubernetes-validations"])
    assert "maxCpuLoras >= self.maxLoras" in rules
    assert all(node.get("description") for path, node in _walk(spec) if path.count(".") == 1)


def test_generated_yaml_has_no_anchors() -> None:
    text = "".join(dump(c) for c in crds().values())
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load_all(text)
