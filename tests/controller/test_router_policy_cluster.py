"""A router that refuses an edit of its policy document says so on its Pod, and the pool's condition reads it.

Real parts: the local control plane, a ``lorapool sim`` process, and ``lorapool router`` with
``--policy-file`` running as the ServiceAccount bound to the Role the operator renders for it (so the
test also proves the Role lets it write the annotation ``lorapool.io/router-policy``). The condition is
computed by the operator's own pure steps (``api.pods.router_pods`` -> ``controller.decide``'s
``router_policy_observed`` -> ``controller.status``) over the Pod as the API server returns it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorapool.api.pods import router_pods
from lorapool.api.routerpolicy import PolicyState
from lorapool.api.status import Condition
from lorapool.controller.decide import router_policy_observed
from lorapool.controller.status import router_policy_condition
from lorapool.render import names
from lorapool.render.manifests import router_policy
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S
from lorapool_dev.testing.accounts import bare_pool, create_accounts
from lorapool_dev.testing.components import start_router, start_sim
from lorapool_dev.testing.wait import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(CLUSTER_START_S + 120)]

POOL = "policies"
ROUTER_POD = f"{POOL}-router-0"
TYPO = '{"apiVersion": "lorapool.io/v1alpha1", "kind": "RouterPolicy", "policy": "afinity"}\n'


@pytest.fixture
def router_account(local_cluster: LocalCluster) -> Iterator[tuple[str, Any, Path]]:
    """A namespace with the router's rendered account and its Pod; yields (namespace, admin client, kubeconfig)."""
    from kubernetes import client as k8s
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    ns = f"router-policy-{uuid.uuid4().hex[:6]}"
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    create_accounts(core, rbac, bare_pool(POOL, ns), ["router"])
    pod = {"name": ROUTER_POD, "labels": names.labels(POOL, "router")}
    core.create_namespaced_pod(ns, {"metadata": pod, "spec": {"containers": [{"name": "r", "image": "lorapool"}]}})
    yield ns, api, local_cluster.service_account_kubeconfig(ns, names.router(POOL))
    core.delete_namespace(ns)
    api.close()


def _condition(api: Any, ns: str) -> tuple[Condition, PolicyState | None]:
    """The pool's RouterPolicyAccepted as the operator computes it from the listed router pods."""
    from kubernetes import client as k8s

    listed = k8s.CoreV1Api(api).list_namespaced_pod(ns, label_selector=names.selector_string(POOL, "router"))
    routers = router_pods(api.sanitize_for_serialization(listed)["items"])
    observed = router_policy_observed(bare_pool(POOL, ns), routers)
    return router_policy_condition(observed, 1), routers[0].policy


Seen = tuple[Condition, PolicyState]


def _when(api: Any, ns: str, refused: bool) -> Seen | None:
    """The condition once the router pod's state is published and says (or no longer says) it refused."""
    condition, state = _condition(api, ns)
    return (condition, state) if state is not None and (state.refused is not None) == refused else None


def test_a_refused_edit_reaches_the_pool_condition(router_account: tuple[str, Any, Path], tmp_path: Path) -> None:
    ns, api, kubeconfig = router_account
    rendered = router_policy(bare_pool(POOL, ns))
    path = tmp_path / "policy.json"
    path.write_text(rendered.to_json())
    sim = start_sim(time_scale=0)
    extra = ["--policy-file", str(path), "--pod", f"{ns}/{ROUTER_POD}", "--poll-interval", "0.2"]
    router = start_router([sim.url], extra=extra, env={"KUBECONFIG": str(kubeconfig)})
    try:
        accepted, _ = wait_until(
            "the router to publish the document it runs",
            lambda: _when(api, ns, refused=False),
            describe=lambda: router.proc.output()[-2000:],
        )
        assert (accepted.status, accepted.reason) == ("True", "Accepted")
        assert accepted.message == f"1/1 router pod(s) run policy document {rendered.hash}"

        path.write_text(TYPO)
        refused, state = wait_until(
            "the router to publish the refusal",
            lambda: _when(api, ns, refused=True),
            describe=lambda: router.proc.output()[-2000:],
        )
        assert state.running == rendered.hash  # the last good one runs on
        assert (refused.status, refused.reason) == ("False", "Refused")
        assert refused.message.startswith(f"router pod {ROUTER_POD} refused policy document ")
        assert "policy: Input should be 'affinity'" in refused.message

        path.write_text(rendered.to_json())
        healed, _ = wait_until(
            "the router to publish the fixed document",
            lambda: _when(api, ns, refused=False),
            describe=lambda: router.proc.output()[-2000:],
        )
        assert (healed.status, healed.reason) == ("True", "Accepted")
    finally:
        router.proc.close()
        sim.proc.close()
