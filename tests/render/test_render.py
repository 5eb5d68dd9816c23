"""The renderer: golden output for the README example, schema validity, and its invariants."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from lorapool.api.adapterset import AdapterSet
from lorapool.api.load import parse_object
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.api.traffic import TRAFFIC_CONFIGMAP_KEY, Priority, TrafficPolicy
from lorapool.api.yamlio import dump_all
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import names
from lorapool.render.manifests import RenderOptions, render_pool

GOLDEN = Path(__file__).parent / "golden"


def render(doc: dict[str, Any], adapters: list[LoRAAdapter] | None = None) -> list[dict[str, Any]]:
    pool = parse_object(doc)
    assert isinstance(pool, LoRAPool)
    merged = merge_adapters(pool, adapters or [])
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters])
    return render_pool(pool, plan, merged.adapters, RenderOptions(lorapool_image="lorapool:test"))


def by_kind(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_example_matches_golden(example_doc: dict[str, Any]) -> None:
    text = dump_all(render(example_doc))
    golden = GOLDEN / "llama3-8b.yaml"
    if os.environ.get("LORAPOOL_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), "render changed: review and set LORAPOOL_UPDATE_GOLDEN=1 to accept"


def test_rendered_objects_validate_against_kubernetes_schemas(example_doc: dict[str, Any]) -> None:
    import kubernetes_validate

    example_doc["metadata"]["uid"] = "0f6f1c3e-0000-4000-8000-000000000001"
    example_doc["spec"]["credentials"] = {
        "huggingFace": {"name": "hf", "key": "token"},
        "s3": {"secretName": "s3", "endpoint": "https://minio.example:9000", "region": "us-east-1"},
    }
    for obj in render(example_doc):
        kubernetes_validate.validate(obj, "1.36.0", strict=True)


def test_engine_args_are_vllm_flags_from_the_plan(example_doc: dict[str, Any]) -> None:
    engine = by_kind(render(example_doc), "Deployment", "llama3-8b-engine")
    vllm = engine["spec"]["template"]["spec"]["containers"][0]
    args = vllm["args"]
    assert "--enable-lora" in args and "--enable-loras" not in args
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert (args[args.index("--max-loras") + 1], args[args.index("--max-lora-rank") + 1]) == ("8", "16")
    assert int(args[args.index("--max-cpu-loras") + 1]) >= 8
    assert flags.get("--served-model-name") == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"} in vllm["env"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    pod = engine["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"]
    # The sidecar reads the adapter set through the API: no volume names it, so the set never rolls a pod.
    assert not [v for v in pod["volumes"] if "configMap" in v]
    sidecar = pod["containers"][1]
    assert sidecar["args"][sidecar["args"].index("--adapters-configmap") + 1] == "$(POD_NAMESPACE)/llama3-8b-adapters"


# The flags on vLLM's own parser, per supported release: tests/render/test_vllm_parser.py.


def test_adapters_change_only_the_configmap(example_doc: dict[str, Any]) -> None:
    before = render(example_doc)
    extra = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": "legal", "namespace": "ml"},
            "spec": {"poolRef": {"name": "llama3-8b"}, "source": "https://example.test/legal.tar.gz", "rank": 8},
        }
    )
    after = render(example_doc, [extra])  # type: ignore[list-item]
    changed = [o["kind"] + "/" + o["metadata"]["name"] for o, p in zip(after, before, strict=True) if o != p]
    assert changed == ["ConfigMap/llama3-8b-adapters"]
    cm = by_kind(after, "ConfigMap", "llama3-8b-adapters")
    assert [a.name for a in AdapterSet.from_json(cm["data"]["adapters.json"]).adapters] == [
        "sql-coder",
        "support-bot",
        "legal",
    ]


def test_flag_change_changes_the_config_hash(example_doc: dict[str, Any]) -> None:
    def hash_of(objects: list[dict[str, Any]]) -> str:
        engine = by_kind(objects, "Deployment", "llama3-8b-engine")
        return engine["spec"]["template"]["metadata"]["annotations"][names.CONFIG_HASH_ANNOTATION]

    first = hash_of(render(example_doc))
    assert hash_of(render(example_doc)) == first
    example_doc["spec"]["adapters"][0]["rank"] = 64
    assert hash_of(render(example_doc)) != first


def test_owner_references_only_with_a_uid(example_doc: dict[str, Any]) -> None:
    assert all("ownerReferences" not in o["metadata"] for o in render(example_doc))
    example_doc["metadata"]["uid"] = "u-1"
    for obj in render(example_doc):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["kind"] == "LoRAPool" and ref["uid"] == "u-1" and ref["controller"] is True
        assert obj["metadata"]["labels"][names.POOL_LABEL] == "llama3-8b"


@pytest.mark.parametrize(
    ("gpu", "selector_key"),
    [
        ({"product": "A100-40GB", "nodeSelector": {"pool": "gpu"}}, "nodeSelector"),
        ({"product": "A100-40GB"}, "affinity"),
    ],
)
def test_node_placement_override(example_doc: dict[str, Any], gpu: dict[str, Any], selector_key: str) -> None:
    example_doc["spec"]["gpu"] = gpu
    pod = by_kind(render(example_doc), "Deployment", "llama3-8b-engine")["spec"]["template"]["spec"]
    assert selector_key in pod


def test_secrets_are_referenced_never_inlined(example_doc: dict[str, Any]) -> None:
    example_doc["spec"]["credentials"] = {"huggingFace": {"name": "hf", "key": "token"}}
    text = dump_all(render(example_doc))
    assert "secretKeyRef" in text and "HF_TOKEN" in text


def test_traffic_rules_change_only_the_traffic_configmap(example_doc: dict[str, Any]) -> None:
    """Priorities and limits of inline adapters and LoRAAdapters reach the routers without a restart."""
    before = render(example_doc)
    doc = copy.deepcopy(example_doc)
    doc["spec"]["adapters"][0]["traffic"] = {"priority": "critical"}
    doc["spec"]["router"] = {**doc["spec"].get("router", {}), "replicas": 3}
    team = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": "legal", "namespace": "ml"},
            "spec": {
                "poolRef": {"name": "llama3-8b"},
                "source": "https://example.test/legal.tar.gz",
                "rank": 8,
                "traffic": {"priority": "sheddable", "limits": {"requestsPerSecond": 5, "tokensPerMinute": 90000}},
            },
        }
    )
    after = render(doc, [team])  # type: ignore[list-item]
    # Several routers gain their PodDisruptionBudget (docs/high-availability.md); the rest is object for object.
    (budget,) = [o for o in after if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "llama3-8b-router"]
    after = [o for o in after if o is not budget]
    changed = {o["kind"] + "/" + o["metadata"]["name"] for o, p in zip(after, before, strict=True) if o != p}
    # The adapters' ConfigMap gains the LoRAAdapter; the router's Deployment only its replica count.
    assert changed == {"ConfigMap/llama3-8b-adapters", "ConfigMap/llama3-8b-traffic", "Deployment/llama3-8b-router"}
    router = by_kind(after, "Deployment", "llama3-8b-router")
    assert router["spec"]["template"] == by_kind(before, "Deployment", "llama3-8b-router")["spec"]["template"]
    policy = TrafficPolicy.from_json(by_kind(after, "ConfigMap", "llama3-8b-traffic")["data"][TRAFFIC_CONFIGMAP_KEY])
    first = doc["spec"]["adapters"][0]["name"]
    assert policy.routers == 3 and set(policy.adapters) == {first, "legal"}
    assert policy.of(first).priority == Priority.CRITICAL and policy.of(first).limits is None
    legal = policy.of("legal")
    assert legal.priority == Priority.SHEDDABLE and legal.limits is not None
    assert legal.limits.requests_per_second == 5 and legal.limits.tokens_per_minute == 90000


def _router_args(doc: dict[str, Any]) -> list[str]:
    args: list[str] = by_kind(render(doc), "Deployment", names.router(doc["metadata"]["name"]))["spec"]["template"][
        "spec"
    ]["containers"][0]["args"]
    return args


def _policy_text(doc: dict[str, Any]) -> str:
    from lorapool.api.routerpolicy import ROUTER_POLICY_CONFIGMAP_KEY

    name = names.router_policy_configmap(doc["metadata"]["name"])
    text: str = by_kind(render(doc), "ConfigMap", name)["data"][ROUTER_POLICY_CONFIGMAP_KEY]
    return text


def test_dispatch_and_slots_render_into_the_document_the_router_reads(example_doc: dict[str, Any]) -> None:
    """spec.router.dispatch and the plan's maxLoras/maxCpuLoras go into <pool>-router-policy, not onto
    the command line; the router's own parser and builder read the rendered file into its knobs."""
    import argparse

    from lorapool.api.routerpolicy import RouterPolicyDocument
    from lorapool.router.cli import configure, settings_from
    from lorapool.router.core.document import SchedulerKnobs, apply, knobs

    doc = copy.deepcopy(example_doc)
    flags = {"--fair-dispatch", "--max-prefilling", "--max-inflight", "--max-queue-wait", "--max-wait", "--max-loras"}
    assert not (flags | {"--max-cpu-loras"}) & set(_router_args(doc))
    doc["spec"].setdefault("router", {})["dispatch"] = {"fair": True, "maxPrefilling": 4, "maxQueueWaitSeconds": 7.5}
    assert not (flags | {"--max-cpu-loras"}) & set(_router_args(doc))
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = settings_from(parser.parse_args(_router_args(doc)[1:]))  # args[0] is the subcommand
    assert settings.policy_flags == ()  # nothing over the document
    rendered = apply(RouterPolicyDocument.from_json(_policy_text(doc)), settings.policy_overrides())
    assert knobs(rendered) == SchedulerKnobs(
        fair=True,
        max_prefilling=4,
        max_inflight=0,
        max_queue_wait_s=7.5,
        max_wait_s=2.0,
        max_loras=8,
        max_cpu_loras=307,
    )
    doc["spec"]["router"]["dispatch"] = {"maxInflight": 16}  # a cap without fair order
    got = knobs(RouterPolicyDocument.from_json(_policy_text(doc)))
    assert (got.fair, got.max_prefilling, got.max_inflight, got.max_queue_wait_s) == (False, 0, 16, 30.0)


def _template_hash(objects: list[dict[str, Any]], name: str) -> str:
    import hashlib
    import json

    template = by_kind(objects, "Deployment", names.router(name))["spec"]["template"]
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()


CHANGES = {
    "spec.router.dispatch": lambda d: (
        d["spec"].setdefault("router", {}).update(dispatch={"fair": True, "maxInflight": 8, "maxQueueWaitSeconds": 5})
    ),
    "the plan's maxLoras and maxCpuLoras": lambda d: d["spec"]["lora"].update(maxLoras=16, maxCpuLoras=64),
}


@pytest.mark.parametrize("change", list(CHANGES.values()), ids=list(CHANGES))
def test_a_dispatch_change_or_a_re_plan_rolls_no_router_pod(example_doc: dict[str, Any], change: Any) -> None:
    """The router Deployment's pod template (its hash) stays; only <pool>-router-policy changes."""
    name = example_doc["metadata"]["name"]
    before = render(example_doc)
    doc = copy.deepcopy(example_doc)
    change(doc)
    after = render(doc)
    assert _template_hash(after, name) == _template_hash(before, name)
    policy = names.router_policy_configmap(name)
    assert by_kind(after, "ConfigMap", policy) != by_kind(before, "ConfigMap", policy)


def test_prefix_weight_renders_a_policy_document_the_router_builds(example_doc: dict[str, Any]) -> None:
    """spec.router.prefixWeight goes into <pool>-router-policy (weights.prefix), not onto the command
    line; the router's own parser and builder read the rendered file into the prefix scorer's weight."""
    import argparse

    from lorapool.api.routerpolicy import ROUTER_POLICY_CONFIGMAP_KEY, RouterPolicyDocument
    from lorapool.router.cli import configure, settings_from
    from lorapool.router.core.document import resolve

    doc = copy.deepcopy(example_doc)
    name = doc["metadata"]["name"]
    args = _router_args(doc)
    assert "--prefix-weight" not in args and "--policy" not in args  # the document carries both
    assert args[args.index("--policy-file") + 1] == f"{names.ROUTER_POLICY_MOUNT}/{ROUTER_POLICY_CONFIGMAP_KEY}"
    doc["spec"].setdefault("router", {})["prefixWeight"] = 1.5
    data = by_kind(render(doc), "ConfigMap", names.router_policy_configmap(name))["data"][ROUTER_POLICY_CONFIGMAP_KEY]
    assert resolve(RouterPolicyDocument.from_json(data)).prefix_weight == 1.5
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = settings_from(parser.parse_args(_router_args(doc)[1:]))
    assert settings.policy_flags == ()  # no policy flag rendered: the document alone decides
