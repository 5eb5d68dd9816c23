"""The checked-in CRDs are what the models generate, and they are valid apiextensions/v1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.crd import crds
from lorapool.api.models import API_VERSION, GROUP, VERSION, LoRAPoolSpec
from lorapool.api.status import AdapterPhase, ConditionType
from lorapool.api.yamlio import dump
from lorapool.plan.planner import AdapterRank, Plan, plan_pool

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


def test_generated_yaml_has_no_anchors_and_reads_back_as_generated() -> None:
    for crd in crds().values():
        text = dump(crd)
        assert "&id" not in text and "*id" not in text
        assert yaml.safe_load(text) == crd


# --- descriptions read against what the code does ---------------------------------------------


def _pool_schema() -> dict[str, Any]:
    crd = crds()["lorapool.io_lorapools.yaml"]
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _plan(lora: dict[str, Any] | None = None, n_adapters: int = 1, **spec: Any) -> Plan:
    base = {
        "baseModel": {"name": "meta-llama/Meta-Llama-3-8B", "source": "hf://meta-llama/Meta-Llama-3-8B"},
        "gpu": {"product": "A100-80GB"},
        "lora": lora or {},
    }
    pool_spec = LoRAPoolSpec.model_validate(base | spec)
    return plan_pool(pool_spec, [AdapterRank(f"a{i}", f"spec.adapters[{i}]", 8) for i in range(n_adapters)])


def test_max_cpu_loras_auto_follows_pod_memory_not_the_adapter_count() -> None:
    description = _pool_schema()["properties"]["spec"]["properties"]["lora"]["properties"]["maxCpuLoras"]["description"]
    assert "memory" in description and "not the adapter count" in description and ">= maxLoras" in description
    small, large = ({"resources": {"limits": {"memory": m}}} for m in ("48Gi", "256Gi"))
    assert _plan(vllm=small).max_cpu_loras < _plan(vllm=large).max_cpu_loras
    assert _plan(n_adapters=1).max_cpu_loras == _plan(n_adapters=40).max_cpu_loras
    tiny = _plan(vllm={"resources": {"limits": {"memory": "17Gi"}}})
    assert tiny.max_cpu_loras == tiny.max_loras  # "at least maxLoras"


def test_plan_memory_is_described_and_computed_per_gpu() -> None:
    memory = _pool_schema()["properties"]["status"]["properties"]["plan"]["properties"]["memory"]
    assert "per GPU" in memory["description"]
    for field in ("usableBytes", "weightsBytes", "loraBytes", "reserveBytes", "kvCacheBytes"):
        assert "one GPU" in memory["properties"][field]["description"], field
    one, two = _plan(gpu={"product": "A100-80GB", "count": 1}), _plan(gpu={"product": "A100-80GB", "count": 2})
    assert two.memory.usable_bytes == one.memory.usable_bytes  # not summed over GPUs
    assert two.memory.weights_bytes == one.memory.weights_bytes // 2  # split over GPUs


def test_condition_type_description_lists_every_type_written() -> None:
    """tests/controller/test_status.py checks that the types written are exactly ConditionType."""
    for crd in crds().values():
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        description = status["properties"]["conditions"]["items"]["properties"]["type"]["description"]
        assert all(t.value in description for t in ConditionType), description
    phase = _pool_schema()["properties"]["status"]["properties"]["adapters"]["items"]["properties"]["phase"]
    assert all(p.value in phase["description"] for p in AdapterPhase)


def test_api_version_is_group_and_version() -> None:
    assert f"{GROUP}/{VERSION}" == API_VERSION


def test_no_string_rule_is_a_pattern_the_api_server_would_print() -> None:
    """A schema ``pattern`` makes `kubectl apply` print the regular expression; string rules are CEL
    rules with a message that says what a valid value looks like (tests/corpus has the cases)."""
    for crd in crds().values():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema["properties"]["spec"], ".spec"):
            assert "pattern" not in node, path
            for rule in node.get("x-kubernetes-validations", []):
                assert "e.g." in rule["message"] or "must be" in rule["message"], (path, rule)
