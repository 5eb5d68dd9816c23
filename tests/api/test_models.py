from __future__ import annotations

from typing import Any

import pytest

from lorapool.api.adapterset import AdapterSet
from lorapool.api.load import parse_object
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.errors import SpecError


def test_the_issue_example_is_accepted_as_written(example_doc: dict[str, Any]) -> None:
    pool = parse_object(example_doc)
    assert isinstance(pool, LoRAPool)
    assert pool.metadata.namespace == "ml"
    assert pool.spec.gpu.product == "A100-80GB"
    assert [a.name for a in pool.spec.adapters] == ["sql-coder", "support-bot"]
    assert pool.spec.lora.max_loras == "auto"
    assert pool.spec.vllm.max_model_len == 8192


def test_defaults_make_a_minimal_pool_valid() -> None:
    pool = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p"},
            "spec": {"baseModel": {"name": "m", "source": "hf://org/m"}, "gpu": {"product": "A100-40GB"}},
        }
    )
    assert isinstance(pool, LoRAPool)
    assert pool.spec.replicas == 1 and pool.spec.gpu.count == 1
    assert pool.spec.router.policy.value == "affinity"


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node: Any = doc
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.adapters.0.rank", 600, "spec.adapters[0].rank"),
        ("spec.adapters.0.name", "SQL_Coder", "spec.adapters[0].name"),
        ("spec.adapters.1.name", "sql-coder", "names must be unique"),
        ("spec.adapters.0.source", "ftp://x/y", "spec.adapters[0].source"),
        ("spec.adapters.0.sha256", "abc", "spec.adapters[0].sha256"),
        ("spec.gpu.product", "T4", "spec.gpu.product"),
        ("spec.gpu.count", 3, "spec.gpu.count"),
        ("spec.lora.maxLoraRank", 48, "not a vLLM rank"),
        ("spec.lora.maxLoras", 0, "spec.lora.maxLoras"),
        ("spec.lora.maxCpuLoras", 1, "maxCpuLoras=1 is below maxLoras=4"),
        ("spec.vllm.gpuMemoryUtilization", 1.5, "spec.vllm.gpuMemoryUtilization"),
        ("spec.vllm.extraArgs", ["--max-loras=9"], "--max-loras is set by lorapool"),
        ("spec.replicas", -1, "spec.replicas"),
        ("spec.typo", 1, "unknown field"),
        ("metadata.name", "Bad_Name", "metadata.name"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_bad_input_names_the_field(example_doc: dict[str, Any], path: str, value: Any, expected: str) -> None:
    example_doc["spec"]["lora"]["maxLoras"] = 4
    with pytest.raises(SpecError) as info:
        parse_object(_set(example_doc, path, value))
    assert any(expected in problem for problem in info.value.problems), info.value.problems
    assert all(":" in problem for problem in info.value.problems)


def test_every_problem_is_reported_at_once(example_doc: dict[str, Any]) -> None:
    example_doc["spec"]["adapters"][0]["rank"] = 600
    example_doc["spec"]["gpu"]["product"] = "T4"
    with pytest.raises(SpecError) as info:
        parse_object(example_doc)
    assert len(info.value.problems) == 2


def test_wrong_kind_and_version_are_refused(example_doc: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match="apiVersion"):
        parse_object({**example_doc, "apiVersion": "lorapool.io/v1"})
    with pytest.raises(SpecError, match="kind"):
        parse_object({**example_doc, "kind": "Pool"})


def test_loraadapter_becomes_an_inline_adapter() -> None:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": "legal-qa", "namespace": "ml"},
            "spec": {"poolRef": {"name": "llama3-8b"}, "source": "https://example.test/a.tar.gz", "rank": 32},
        }
    )
    assert isinstance(obj, LoRAAdapter)
    assert obj.as_adapter().model_dump(exclude_none=True) == {
        "name": "legal-qa",
        "source": "https://example.test/a.tar.gz",
        "rank": 32,
    }


def test_adapterset_round_trips_and_refuses_unknown_fields() -> None:
    text = AdapterSet(
        pool="p", base_model="m", max_lora_rank=16, adapters=({"name": "a", "source": "file:///x"},)
    ).to_json()  # type: ignore[arg-type]
    assert AdapterSet.from_json(text).adapters[0].name == "a"
    with pytest.raises(ValueError):
        AdapterSet.from_json(text.replace('"pool"', '"poool"'))
    with pytest.raises(ValueError):
        AdapterSet.from_json(text.replace('"name": "a"', '"name": "../etc"'))
