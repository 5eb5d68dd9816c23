"""The routers' shared books as rendered (spec.router.sharedState, docs/high-availability.md): the
router's flags and credentials env for both forms and both doors, the store the operator runs for
``rendered`` (its pod's bounds and security, its Service, the NetworkPolicy that admits the routers
alone), and the routers' PodDisruptionBudget and spreading. Pure, except the last test, which runs
Debian's redis-server with the rendered command line and fills it to the brim."""

from __future__ import annotations

import argparse
import copy
import re
import shlex
import subprocess
import tempfile
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import books, names
from lorapool.render.manifests import RenderOptions, render_pool
from lorapool.router.cli import configure, settings_from
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.redisstore import redis_server
from lorapool_dev.testing.wait import wait_until
from tests.delivery.helm import REPO

Obj = dict[str, Any]
UID = "0f6f1c3e-0000-4000-8000-000000000043"
POOL, NS = "llama3-8b", "ml"
STORE = f"{POOL}-books"
URL = "rediss://cache.example:6380/2"
SECRET = {"name": "books-acl"}


def pool_doc(example_doc: Obj, uid: str | None = UID, **router: Any) -> Obj:
    doc = copy.deepcopy(example_doc)
    if uid:
        doc["metadata"]["uid"] = uid
    doc["spec"]["router"] = router
    return doc


def render(doc: Obj, image: str = "registry.test/team/lorapool:1.2.3") -> list[Obj]:
    pool = parse_object(doc)
    assert isinstance(pool, LoRAPool), pool
    merged = merge_adapters(pool, [])
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters])
    return render_pool(pool, plan, merged.adapters, RenderOptions(lorapool_image=image))


def find(objects: list[Obj], kind: str, name: str) -> Obj | None:
    return next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name), None)


def get(objects: list[Obj], kind: str, name: str) -> Obj:
    found = find(objects, kind, name)
    assert found is not None, f"no {kind} {name} rendered"
    return found


def router_container(objects: list[Obj]) -> Obj:
    container: Obj = get(objects, "Deployment", names.router(POOL))["spec"]["template"]["spec"]["containers"][0]
    return container


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_without_shared_state_nothing_is_rendered_for_it(example_doc: Obj) -> None:
    objects = render(pool_doc(example_doc))
    container = router_container(objects)
    assert not [a for a in container["args"] if a.startswith("--shared-state")]
    assert not [e for e in container["env"] if e["name"].startswith("LORAPOOL_SHARED_STATE")]
    assert not [o for o in objects if o["metadata"]["name"] == STORE]
    assert find(objects, "PodDisruptionBudget", names.router(POOL)) is None  # one router: no budget


@pytest.mark.parametrize("door", ["router", "gateway", "both"])
def test_an_external_store_is_a_flag_and_its_credentials_are_env_from_the_secret(example_doc: Obj, door: str) -> None:
    shared = {"url": URL, "credentialsSecret": {**SECRET, "passwordKey": "pw"}}
    doc = pool_doc(example_doc, frontDoor=door, gateway={"namespace": "gw"}, sharedState=shared)
    objects = render(doc)
    container = router_container(objects)
    args = container["args"]
    assert args.count("--shared-state") == 1 and flag(args, "--shared-state") == URL  # one process, both doors
    assert flag(args, "--shared-state-key") == UID  # one store, many pools: keys by the pool's uid
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "LORAPOOL_SHARED" in e["name"]}
    assert env == {
        books.USERNAME_ENV: {"name": "books-acl", "key": "username", "optional": True},
        books.PASSWORD_ENV: {"name": "books-acl", "key": "pw"},
    }
    assert not [o for o in objects if o["metadata"]["name"] == STORE]  # the user's store: nothing to run
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = settings_from(parser.parse_args(args[1:]))  # the router takes the rendered flags
    assert settings.shared_state == URL and settings.shared_state_key == UID


def test_an_offline_render_keys_the_store_by_namespace_and_name(example_doc: Obj) -> None:
    objects = render(pool_doc(example_doc, uid=None, sharedState={"url": "redis://cache:6379"}))
    args = router_container(objects)["args"]
    assert flag(args, "--shared-state-key") == f"{NS}/{POOL}"
    assert not [e for e in router_container(objects)["env"] if "LORAPOOL_SHARED" in e["name"]]  # no Secret, no env


def test_a_rendered_store_is_its_policy_service_and_deployment_owned_by_the_pool(example_doc: Obj) -> None:
    objects = render(pool_doc(example_doc, sharedState={"rendered": {}}))
    kinds = [o["kind"] for o in objects if o["metadata"]["name"] == STORE]
    assert kinds == ["NetworkPolicy", "Service", "Deployment"]  # the policy before the pod it guards
    for kind in kinds:
        obj = get(objects, kind, STORE)
        assert obj["metadata"]["namespace"] == NS
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
        kubernetes_validate.validate(obj, "1.36.0", strict=True)
    names_in_order = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert names_in_order.index(("Deployment", STORE)) < names_in_order.index(("Deployment", names.router(POOL)))
    args = router_container(objects)["args"]
    assert flag(args, "--shared-state") == f"redis://{STORE}.{NS}.svc:6379/0"
    assert not [e for e in router_container(objects)["env"] if "LORAPOOL_SHARED" in e["name"]]


def test_the_rendered_store_is_memory_only_bounded_non_root_and_tokenless(example_doc: Obj) -> None:
    objects = render(pool_doc(example_doc, sharedState={"rendered": {"maxMemory": "100Mi"}}))
    deployment = get(objects, "Deployment", STORE)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.test/team/lorapool-books:1.2.3"
    assert container["command"] == ["redis-server"]
    args = container["args"]
    assert flag(args, "--maxmemory") == str(100 * 2**20) and flag(args, "--maxmemory-policy") == "noeviction"
    assert flag(args, "--save") == "" and flag(args, "--appendonly") == "no" and flag(args, "--port") == "6379"
    assert flag(args, "--dir") == "/data"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == "data")
    # 100Mi * 1.5 + 32Mi, requested as much as the limit
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "182Mi"}, "limits": {"memory": "182Mi"}}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "redis"}


def test_the_rendered_store_takes_an_image_and_resources_of_the_users(example_doc: Obj) -> None:
    resources = {"limits": {"memory": "1Gi", "cpu": "1"}}
    shared = {"rendered": {"image": "valkey/valkey:8", "resources": resources}}
    (container,) = get(render(pool_doc(example_doc, sharedState=shared)), "Deployment", STORE)["spec"]["template"][
        "spec"
    ]["containers"]
    assert container["image"] == "valkey/valkey:8" and container["resources"] == resources


def test_the_network_policy_admits_the_pools_router_pods_alone_on_the_store_port(example_doc: Obj) -> None:
    doc = pool_doc(example_doc, sharedState={"rendered": {}})
    doc["spec"].setdefault("security", {})["networkPolicy"] = False  # the engines' switch, not the store's
    objects = render(doc)
    policy = get(objects, "NetworkPolicy", STORE)["spec"]
    store_labels = get(objects, "Deployment", STORE)["spec"]["template"]["metadata"]["labels"]
    router_labels = get(objects, "Deployment", names.router(POOL))["spec"]["template"]["metadata"]["labels"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"]["matchLabels"].items() <= store_labels.items()
    assert not policy["podSelector"]["matchLabels"].items() <= router_labels.items()
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # this namespace only
    assert peer["podSelector"]["matchLabels"].items() <= router_labels.items()
    assert not peer["podSelector"]["matchLabels"].items() <= store_labels.items()
    service = get(objects, "Service", STORE)["spec"]
    assert service["selector"].items() <= store_labels.items() and service["ports"][0]["port"] == 6379


@pytest.mark.parametrize(("replicas", "budget"), [(0, False), (1, False), (2, True), (3, True)])
def test_several_routers_get_a_budget_and_spread_over_nodes(example_doc: Obj, replicas: int, budget: bool) -> None:
    objects = render(pool_doc(example_doc, replicas=replicas))
    pdb = find(objects, "PodDisruptionBudget", names.router(POOL))
    assert (pdb is not None) == budget
    pod = get(objects, "Deployment", names.router(POOL))["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if pdb is not None:
        kubernetes_validate.validate(pdb, "1.36.0", strict=True)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["metadata"]["ownerReferences"][0]["uid"] == UID
    # Rendered for any count, so scaling the routers never rolls them.
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    (apart,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert apart["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    assert "nodeAffinity" in pod["spec"]["affinity"]  # still off the GPU nodes first


@pytest.mark.parametrize(
    ("operator_image", "expected"),
    [
        ("ghcr.io/lorapool/lorapool:0.1.0", "ghcr.io/lorapool/lorapool-books:0.1.0"),
        ("localhost:5000/lorapool:dev", "localhost:5000/lorapool-books:dev"),
        ("lorapool:test", "lorapool-books:test"),
        ("registry.test/lorapool@sha256:" + "0" * 64, "registry.test/lorapool-books:0.1.0"),
        ("registry.test/lorapool", "registry.test/lorapool-books:0.1.0"),
    ],
    ids=["release", "registry-with-port", "bare", "digest", "untagged"],
)
def test_the_default_image_sits_beside_the_operators(operator_image: str, expected: str) -> None:
    assert books.default_image(operator_image) == expected


def test_redis_server_runs_the_rendered_command_line_and_a_full_store_refuses_writes(example_doc: Obj) -> None:
    """Debian's redis-server (the books image's) takes the rendered args; at maxmemory it refuses a
    write with an error (which the routers count), and drops nothing it holds."""
    objects = render(pool_doc(example_doc, sharedState={"rendered": {"maxMemory": "8Mi"}}))
    (container,) = get(objects, "Deployment", STORE)["spec"]["template"]["spec"]["containers"]
    args, port = list(container["args"]), free_port()
    args[args.index("--port") + 1] = str(port)
    with tempfile.TemporaryDirectory() as data:
        args[args.index("--dir") + 1] = data
        proc = subprocess.Popen([redis_server(), *args, "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port, socket_timeout=5)
            wait_until("the rendered redis-server answers", client.ping, 15, retry_on=(redis.ConnectionError,))
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert client.config_get("maxmemory") == {"maxmemory": str(8 * 2**20)}
            assert client.config_get("save") == {"save": ""}
            written, value = 0, b"x" * 65536
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                for written in range(1000):  # 64 MB: far past 8Mi
                    client.set(f"k{written}", value)
            assert client.dbsize() == written  # every key written before the refusal is still there
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_the_docs_examples_render_and_their_command_line_is_the_rendered_one() -> None:
    """docs/high-availability.md: its YAML is valid (the pools render), and the store's command line
    and memory it spells out are what the renderer gives a default ``rendered: {}``."""
    text = (REPO / "docs" / "high-availability.md").read_text()
    docs = [d for b in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(b) if d]
    pools = [d for d in docs if d["kind"] == "LoRAPool"]
    assert len(pools) == 2 and [d["kind"] for d in docs if d["kind"] != "LoRAPool"] == ["Secret"]
    kubernetes_validate.validate(next(d for d in docs if d["kind"] == "Secret"), "1.36.0", strict=True)
    external, rendered = (render({**d, "metadata": {**d["metadata"], "uid": UID}}) for d in pools)
    assert flag(router_container(external)["args"], "--shared-state") == "rediss://books.cache.example:6380/0"
    (container,) = get(rendered, "Deployment", STORE)["spec"]["template"]["spec"]["containers"]
    spelled = re.search(r"`(redis-server --port 6379 [^`]+)`", text)
    assert spelled is not None
    expected = shlex.split(spelled.group(1).replace("<bytes>", str(64 * 2**20)))
    assert [*container["command"], *container["args"]] == expected
    assert "(default `maxMemory` 64Mi: 128Mi)" in text
    assert container["resources"]["limits"]["memory"] == "128Mi"
