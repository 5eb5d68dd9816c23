"""deploy/admission-policy.yaml in a real API server: a pool's engine and router ServiceAccounts
write the status of their own Pod only.

Their Roles (rendered by the product, as the operator applies them) grant ``patch pods/status``
on every pod of the namespace, since RBAC cannot name a generated Pod. The policy asks the
requester's token to be bound to the target Pod (the claim the kubelet's projected tokens carry,
``authentication.kubernetes.io/pod-name``). Tokens here come from the TokenRequest API, bound to
a Pod as the kubelet binds them or unbound; the writes go through the product's own writer
(``lorapool.podstatus.patch_status``, used by sidecar and router).

The policy is the deploy/ copy with its binding scoped to this test's namespace and its own
names: other tests of the session write reports with unbound tokens. It is deleted at the end.
It also keeps the labels of a lorapool Pod as they are (a report never changes them).
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.report import ANNOTATION, SYNCED_CONDITION
from lorapool.podstatus import PodRef, api_server, patch_status, session
from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S
from lorapool_dev.testing.accounts import bare_pool, create_accounts
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(CLUSTER_START_S + 120)]

REPO = Path(__file__).resolve().parents[2]
POOL = "guarded"
ENGINE_A, ENGINE_B, ROUTER, OTHER = "engine-a", "engine-b", "router-0", "not-lorapool"
RULE = "may write the status of its own Pod only"
FORGED = json.dumps(
    {
        "metadata": {"annotations": {ANNOTATION: "forged"}},
        "status": {"conditions": [{"type": SYNCED_CONDITION, "status": "True", "reason": "Synced"}]},
    }
)


@dataclass(frozen=True)
class Guarded:
    """The test namespace with the policy active in it, and the kubeconfigs to write as."""

    namespace: str
    policy: str
    engine_a: Path  # <pool>-engine, token bound to ENGINE_A
    router: Path  # <pool>-router, token bound to ROUTER
    engine_unbound: Path  # <pool>-engine, token bound to nothing
    operator: Path  # the operator's account (deploy/rbac.yaml), unbound


def write(kubeconfig: Path, namespace: str, pod: str, document: str = FORGED) -> str | None:
    """One status patch of ``pod`` as the product writes it: None when written, else the refusal."""

    async def run() -> str | None:
        server = api_server(kubeconfig)
        async with session(server, timeout_s=10) as http:
            return await patch_status(http, server, PodRef(namespace, pod), document)

    return asyncio.run(run())


def scoped_policy(namespace: str) -> list[dict[str, Any]]:
    """deploy/admission-policy.yaml with names of its own and its binding limited to ``namespace``."""
    policy, binding = (d for d in yaml.safe_load_all((REPO / "deploy" / "admission-policy.yaml").read_text()) if d)
    policy, binding = copy.deepcopy(policy), copy.deepcopy(binding)
    name = f"{policy['metadata']['name']}-{namespace}"
    policy["metadata"]["name"] = binding["metadata"]["name"] = binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    return [policy, binding]


def _pod(name: str, account: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod that stays Pending (no node matches): only its API object matters here."""
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "nodeSelector": {"lorapool.io/test": "no-such-node"},
            "containers": [{"name": "c", "image": "lorapool"}],
        },
    }


@pytest.fixture(scope="module")
def guarded(local_cluster: LocalCluster, operator_env: Path) -> Iterator[Guarded]:
    from kubernetes import client as k8s
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    ns = f"own-pod-{uuid.uuid4().hex[:6]}"
    objects = scoped_policy(ns)
    policy = objects[0]["metadata"]["name"]
    core.create_namespace({"metadata": {"name": ns}})
    try:
        create_accounts(core, rbac, bare_pool(POOL, ns), ["engine", "router"])
        engine, router = names.engine_service_account(POOL), names.router(POOL)
        uids = {}
        for name, account, labels in (
            (ENGINE_A, engine, names.labels(POOL, "engine")),
            (ENGINE_B, engine, names.labels(POOL, "engine")),
            (ROUTER, router, names.labels(POOL, "router")),
            (OTHER, engine, {"app": "someone-else"}),
        ):
            uids[name] = core.create_namespaced_pod(ns, _pod(name, account, labels)).metadata.uid

        local_cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(objects))
        guarded = Guarded(
            namespace=ns,
            policy=policy,
            engine_a=local_cluster.service_account_kubeconfig(ns, engine, bound_pod=(ENGINE_A, uids[ENGINE_A])),
            router=local_cluster.service_account_kubeconfig(ns, router, bound_pod=(ROUTER, uids[ROUTER])),
            engine_unbound=local_cluster.service_account_kubeconfig(ns, engine),
            operator=operator_env,
        )
        # A policy takes a moment to reach the admission chain: until then the unbound token writes.
        # Only this policy's refusal says it is there (a 403 of RBAC's would not).
        probe = json.dumps({"metadata": {"annotations": {"lorapool.io/test": "probe"}}})
        last: list[str | None] = [None]

        def refuses_unbound() -> bool:
            last[0] = write(guarded.engine_unbound, ns, ENGINE_A, probe)
            return (last[0] or "").startswith("HTTP 403") and f"ValidatingAdmissionPolicy '{policy}'" in (last[0] or "")

        wait_until("the policy to refuse an unbound engine token", refuses_unbound, 30, describe=lambda: last[0])
        yield guarded
    finally:
        for kind, obj in (("validatingadmissionpolicybinding", objects[1]), ("validatingadmissionpolicy", objects[0])):
            local_cluster.kubectl("delete", kind, obj["metadata"]["name"], "--ignore-not-found", "--wait=true")
        wait_until(
            "the test's policy and binding to be gone",
            lambda: (
                not local_cluster.kubectl(
                    "get", "validatingadmissionpolicy,validatingadmissionpolicybinding", "-o", "name"
                ).stdout.count(policy)
            ),
            timeout_s=30,
        )
        core.delete_namespace(ns)
        api.close()


def pod(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout
    return dict(json.loads(out))


def refused(answer: str | None, policy: str, bound: str, target: str) -> bool:
    """A 403 from this policy that names the rule, the token's pod and the target."""
    if answer is not None:  # the writer passes the API server's JSON body on: <none> comes escaped
        answer = answer.replace("\\u003c", "<").replace("\\u003e", ">")
    return (
        answer is not None
        and answer.startswith("HTTP 403")
        and f"ValidatingAdmissionPolicy '{policy}'" in answer
        and RULE in answer
        and f"token bound to pod {bound}, target {target}" in answer
        and "use the token the kubelet projects into that pod" in answer
    )


@pytest.mark.parametrize(
    ("account", "own", "others"),
    [("engine_a", ENGINE_A, (ENGINE_B, ROUTER)), ("router", ROUTER, (ENGINE_A, ENGINE_B))],
    ids=["engine", "router"],
)
def test_a_token_bound_to_its_pod_writes_that_pod_and_no_other(
    local_cluster: LocalCluster, guarded: Guarded, account: str, own: str, others: tuple[str, ...]
) -> None:
    ns, kubeconfig = guarded.namespace, getattr(guarded, account)
    mark = f"{account}-{uuid.uuid4().hex[:6]}"
    assert write(kubeconfig, ns, own, json.dumps({"metadata": {"annotations": {ANNOTATION: mark}}})) is None
    assert pod(local_cluster, ns, own)["metadata"]["annotations"][ANNOTATION] == mark
    for other in others:
        answer = write(kubeconfig, ns, other)
        assert refused(answer, guarded.policy, own, f"{ns}/{other}"), answer
        forged = pod(local_cluster, ns, other)
        assert (forged["metadata"].get("annotations") or {}).get(ANNOTATION) != "forged"
        assert all(c["type"] != SYNCED_CONDITION for c in forged["status"].get("conditions") or [])


def test_dropping_the_pool_label_in_the_same_patch_does_not_escape(
    local_cluster: LocalCluster, guarded: Guarded
) -> None:
    ns = guarded.namespace
    escape = json.dumps({"metadata": {"labels": {names.POOL_LABEL: None}, "annotations": {ANNOTATION: "forged"}}})
    answer = write(guarded.engine_a, ns, ENGINE_B, escape)
    assert refused(answer, guarded.policy, ENGINE_A, f"{ns}/{ENGINE_B}"), answer
    assert pod(local_cluster, ns, ENGINE_B)["metadata"]["labels"][names.POOL_LABEL] == POOL


@pytest.mark.parametrize(
    "labels",
    [{names.POOL_LABEL: None}, {"app.kubernetes.io/component": "router"}, {"extra": "x"}],
    ids=["drop-pool-label", "change-component", "add-label"],
)
def test_a_token_bound_to_its_pod_may_not_change_that_pods_labels(
    local_cluster: LocalCluster, guarded: Guarded, labels: dict[str, str | None]
) -> None:
    """Its report is an annotation and a condition; the labels select the pod into the pool's Services."""
    ns = guarded.namespace
    before = pod(local_cluster, ns, ENGINE_A)["metadata"]["labels"]
    answer = write(guarded.engine_a, ns, ENGINE_A, json.dumps({"metadata": {"labels": labels}}))
    assert answer is not None and answer.startswith("HTTP 403") and "may not change a Pod's labels" in answer, answer
    assert pod(local_cluster, ns, ENGINE_A)["metadata"]["labels"] == before


def test_an_unbound_token_of_the_engine_account_is_refused_even_on_a_pod_it_runs(guarded: Guarded) -> None:
    ns = guarded.namespace
    answer = write(guarded.engine_unbound, ns, ENGINE_A)
    assert refused(answer, guarded.policy, "<none>", f"{ns}/{ENGINE_A}"), answer


def test_other_pods_and_the_operator_are_not_matched(local_cluster: LocalCluster, guarded: Guarded) -> None:
    """A pod without the pool label: the engine account's RBAC alone decides (it may write). The
    operator's account is not an engine or router account: its unbound token still writes."""
    ns = guarded.namespace
    assert write(guarded.engine_unbound, ns, OTHER) is None
    assert pod(local_cluster, ns, OTHER)["metadata"]["annotations"][ANNOTATION] == "forged"
    mark = json.dumps({"metadata": {"annotations": {"lorapool.io/test": "operator"}}})
    assert write(guarded.operator, ns, ENGINE_A, mark) is None
    assert pod(local_cluster, ns, ENGINE_A)["metadata"]["annotations"]["lorapool.io/test"] == "operator"
