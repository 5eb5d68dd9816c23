"""The gateway door (docs/gateway.md): what each spec.router.frontDoor renders, the NetworkPolicy
peers it opens, and the API's refusals. Pure; tests/controller/test_gateway_cluster.py puts the
InferencePool in a real API server."""

from __future__ import annotations

import argparse
import copy
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.errors import SpecError
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import names
from lorapool.render.manifests import RenderOptions, render_pool
from lorapool.router.cli import configure, settings_from

Objs = list[dict[str, Any]]


def pool_doc(example_doc: dict[str, Any], **router: Any) -> dict[str, Any]:
    doc = copy.deepcopy(example_doc)
    doc["metadata"]["uid"] = "0f6f1c3e-0000-4000-8000-000000000001"
    doc["spec"]["router"] = router
    return doc


def render(doc: dict[str, Any]) -> Objs:
    pool = parse_object(doc)
    assert isinstance(pool, LoRAPool), pool
    merged = merge_adapters(pool, [])
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters])
    return render_pool(pool, plan, merged.adapters, RenderOptions(lorapool_image="lorapool:test"))


def find(objects: Objs, kind: str, name: str) -> dict[str, Any] | None:
    return next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name), None)


def get(objects: Objs, kind: str, name: str) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert found is not None, f"no {kind} {name} rendered"
    return found


def router_pod(objects: Objs, pool: str) -> dict[str, Any]:
    pod: dict[str, Any] = get(objects, "Deployment", names.router(pool))["spec"]["template"]["spec"]
    return pod


def router_container(objects: Objs, pool: str) -> dict[str, Any]:
    container: dict[str, Any] = router_pod(objects, pool)["containers"][0]
    return container


GATEWAY = {"namespace": "envoy-gateway-system"}


@pytest.mark.parametrize(
    ("door", "http", "picker"),
    [("router", True, False), ("gateway", False, True), ("both", True, True)],
)
def test_each_door_renders_its_objects_and_no_other(
    example_doc: dict[str, Any], door: str, http: bool, picker: bool
) -> None:
    name = example_doc["metadata"]["name"]
    objects = render(pool_doc(example_doc, frontDoor=door, gateway=GATEWAY))
    assert (find(objects, "Service", names.router_service(name)) is not None) == http
    assert (find(objects, "Service", names.endpoint_picker(name)) is not None) == picker
    assert (find(objects, "InferencePool", names.inference_pool(name)) is not None) == picker
    assert (find(objects, "NetworkPolicy", names.router_network_policy(name)) is not None) == picker
    args = router_container(objects, name)["args"]
    assert ("--ext-proc-port" in args) == picker
    assert find(objects, "Deployment", names.router(name)) is not None  # the one router serves every door


def test_the_inference_pool_selects_only_the_engine_pods_and_names_a_picker_that_exists(
    example_doc: dict[str, Any],
) -> None:
    name = example_doc["metadata"]["name"]
    objects = render(pool_doc(example_doc, frontDoor="gateway", gateway={**GATEWAY, "failureMode": "FailOpen"}))
    infpool = get(objects, "InferencePool", name)
    assert infpool["apiVersion"] == "inference.networking.k8s.io/v1"
    engine = get(objects, "Deployment", names.engine(name))
    selector = infpool["spec"]["selector"]["matchLabels"]
    assert selector == engine["spec"]["selector"]["matchLabels"]
    router_labels = get(objects, "Deployment", names.router(name))["spec"]["template"]["metadata"]["labels"]
    assert not set(selector.items()) <= set(router_labels.items()), "a router pod must not be a member"
    engine_ports = {p["containerPort"] for p in engine["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["number"] for p in infpool["spec"]["targetPorts"]] == [names.ENGINE_PORT]
    assert names.ENGINE_PORT in engine_ports
    ref = infpool["spec"]["endpointPickerRef"]
    assert ref["failureMode"] == "FailOpen" and ref["kind"] == "Service" and ref["group"] == ""
    epp = get(objects, "Service", ref["name"])  # endpointPickerRef names a Service the pool renders
    port = next(p for p in epp["spec"]["ports"] if p["port"] == ref["port"]["number"])
    container_ports = {p["name"]: p["containerPort"] for p in router_container(objects, name)["ports"]}
    assert container_ports[port["targetPort"]] == names.EXT_PROC_PORT
    assert epp["spec"]["selector"] == names.selector(name, "router")
    assert infpool["metadata"]["ownerReferences"][0]["kind"] == "LoRAPool"  # deleted with the pool


def test_the_picker_flags_parse_with_the_routers_own_parser(example_doc: dict[str, Any]) -> None:
    name = example_doc["metadata"]["name"]
    gateway = {**GATEWAY, "tlsSecretName": "epp-tls", "messageTimeoutSeconds": 3}
    objects = render(pool_doc(example_doc, frontDoor="both", gateway=gateway))
    args = router_container(objects, name)["args"]
    parser = argparse.ArgumentParser()
    configure(parser)
    parsed = parser.parse_args(args[1:])  # args[0] is the subcommand
    assert parsed.ext_proc_message_timeout == 3  # holds bounded by what the gateway waits
    assert parsed.ext_proc_port == names.EXT_PROC_PORT
    assert parsed.ext_proc_health_port == names.EXT_PROC_HEALTH_PORT
    assert parsed.ext_proc_tls_cert == f"{names.EXT_PROC_TLS_MOUNT}/tls.crt"
    assert parsed.ext_proc_tls_key == f"{names.EXT_PROC_TLS_MOUNT}/tls.key"
    settings_from(parsed)  # and the settings accept them


def test_a_tls_secret_is_mounted_read_only_and_self_signing_needs_no_volume(example_doc: dict[str, Any]) -> None:
    name = example_doc["metadata"]["name"]
    with_secret = render(pool_doc(example_doc, frontDoor="gateway", gateway={**GATEWAY, "tlsSecretName": "epp-tls"}))
    pod = router_pod(with_secret, name)
    tls = {"name": "epp-tls", "secret": {"secretName": "epp-tls", "defaultMode": 0o444}}
    assert [v for v in pod["volumes"] if v["name"] == "epp-tls"] == [tls]
    assert all(m["readOnly"] is True for m in pod["containers"][0]["volumeMounts"])
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    self_signed = render(pool_doc(example_doc, frontDoor="gateway", gateway=GATEWAY))
    pod = router_pod(self_signed, name)
    assert [v["name"] for v in pod["volumes"]] == ["traffic", "router-policy"]  # only the two ConfigMaps
    assert "--ext-proc-tls-cert" not in pod["containers"][0]["args"]
    assert "--ext-proc-message-timeout" not in pod["containers"][0]["args"]  # Envoy's default, the router's too


@pytest.mark.parametrize("timeout", [0, -1, 61, "soon"])
def test_a_message_timeout_out_of_range_names_the_field(example_doc: dict[str, Any], timeout: object) -> None:
    with pytest.raises(SpecError, match="messageTimeoutSeconds"):
        render(pool_doc(example_doc, frontDoor="gateway", gateway={**GATEWAY, "messageTimeoutSeconds": timeout}))


def test_the_router_door_renders_what_it_rendered_before(example_doc: dict[str, Any]) -> None:
    """No pool without the field rolls: the default door's objects are today's (the golden file too)."""
    default = render(pool_doc(example_doc))
    explicit = render(pool_doc(example_doc, frontDoor="router", gateway=GATEWAY))
    assert default == explicit


def ingress_peers(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    return [
        peer
        for rule in policy["spec"]["ingress"]
        if {"port": port, "protocol": "TCP"} in rule["ports"]
        for peer in rule.get("from", [{}])
    ]


@pytest.mark.parametrize(
    ("gateway", "peer"),
    [
        (GATEWAY, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}}}),
        (
            {"namespace": "istio-ingress", "podLabels": {"istio": "ingress"}},
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-ingress"}},
                "podSelector": {"matchLabels": {"istio": "ingress"}},
            },
        ),
        ({"cidrs": ["10.129.0.0/23"]}, {"ipBlock": {"cidr": "10.129.0.0/23"}}),
    ],
    ids=["namespace", "namespace-and-pods", "gke-proxy-subnet"],
)
def test_only_the_gateway_reaches_the_picker_and_the_engines(
    example_doc: dict[str, Any], gateway: dict[str, Any], peer: dict[str, Any]
) -> None:
    name = example_doc["metadata"]["name"]
    objects = render(pool_doc(example_doc, frontDoor="gateway", gateway=gateway))
    engine_policy = get(objects, "NetworkPolicy", names.engine_network_policy(name))
    router_policy = get(objects, "NetworkPolicy", names.router_network_policy(name))
    routers = {"podSelector": {"matchLabels": names.selector(name, "router")}}
    assert ingress_peers(engine_policy, names.ENGINE_PORT) == [routers, peer]
    assert ingress_peers(router_policy, names.EXT_PROC_PORT) == [peer]
    # The gateway door alone: the router's HTTP port (its OpenAI API) is not open to every pod.
    assert ingress_peers(router_policy, names.ROUTER_PORT) == []
    both = render(pool_doc(example_doc, frontDoor="both", gateway=gateway))
    policy = get(both, "NetworkPolicy", names.router_network_policy(name))
    assert ingress_peers(policy, names.ROUTER_PORT) == [{}]  # every pod, as without it


def test_rendered_core_objects_validate_against_kubernetes_schemas(example_doc: dict[str, Any]) -> None:
    gateway = {**GATEWAY, "podLabels": {"app": "envoy"}, "cidrs": ["10.0.0.0/8"], "tlsSecretName": "epp-tls"}
    for obj in render(pool_doc(example_doc, frontDoor="both", gateway=gateway)):
        if obj["kind"] != "InferencePool":  # not a core kind: the real API server checks it (test_gateway_cluster)
            kubernetes_validate.validate(obj, "1.36.0", strict=True)


@pytest.mark.parametrize(
    ("router", "security", "message"),
    [
        (
            {"frontDoor": "gateway"},
            {},
            "router.frontDoor gateway or both with security.networkPolicy on needs router.gateway.namespace",
        ),
        ({"frontDoor": "both", "gateway": {"cidrs": []}}, {}, "or router.gateway.cidrs"),
        (
            {"frontDoor": "gateway", "gateway": {"cidrs": ["10.0.0.1/8"]}},
            {},
            "cidrs[0] '10.0.0.1/8' must be an IP block",
        ),
        ({"frontDoor": "gateway", "gateway": {"cidrs": ["ten"]}}, {}, "must be an IP block in CIDR notation"),
        ({"frontDoor": "door"}, {}, "'router', 'gateway' or 'both'"),
        ({"frontDoor": "gateway", "gateway": {**GATEWAY, "failureMode": "Open"}}, {}, "'FailClose' or 'FailOpen'"),
        ({"frontDoor": "gateway", "gateway": {"namespace": "Envoy_GW"}}, {}, "must be a DNS-1123 label"),
    ],
)
def test_bad_gateway_settings_are_refused_naming_the_field(
    example_doc: dict[str, Any], router: dict[str, Any], security: dict[str, Any], message: str
) -> None:
    doc = pool_doc(example_doc, **router)
    doc["spec"]["security"] = security
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("(", r"\(")):
        LoRAPool.model_validate(doc)


def test_without_a_network_policy_the_gateway_needs_no_namespace(example_doc: dict[str, Any]) -> None:
    doc = pool_doc(example_doc, frontDoor="gateway")
    doc["spec"]["security"] = {"networkPolicy": False}
    objects = render(doc)
    assert find(objects, "InferencePool", doc["metadata"]["name"]) is not None
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
