"""EndpointSliceWatch against a real API server, as the router's least-privilege ServiceAccount.

The API server refuses loopback addresses in EndpointSlices and nothing else here is reachable,
so this test drives the watch itself (list, watch, ready flips, a second slice, deletion) and
never lets anything connect to the documentation-range addresses it publishes (RFC 5737).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from lorapool.router.endpointslices import EndpointSliceWatch
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(CLUSTER_START_S + 90)]

SERVICE = "pool-engine"


@pytest.fixture
def router_namespace(local_cluster: LocalCluster) -> Iterator[tuple[str, Any]]:
    """A namespace with a ServiceAccount that may only read EndpointSlices there."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    name = f"router-{uuid.uuid4().hex[:8]}"
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_service_account(name, {"metadata": {"name": "router"}})
    rule = {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["get", "list", "watch"],
    }
    rbac.create_namespaced_role(name, {"metadata": {"name": "router"}, "rules": [rule]})
    rbac.create_namespaced_role_binding(
        name,
        {
            "metadata": {"name": "router"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "router"},
            "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": name}],
        },
    )
    yield name, api
    core.delete_namespace(name)
    api.close()


def endpoint_slice(name: str, address: str, *, ready: bool, service: str = SERVICE) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [address],
                "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "name": f"pod-{name}"},
            }
        ],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


async def _follow(local_cluster: LocalCluster, namespace: str, api: Any) -> list[list[str]]:
    from kubernetes import client, config

    discovery = client.DiscoveryV1Api(api)
    discovery.create_namespaced_endpoint_slice(namespace, endpoint_slice("a", "192.0.2.10", ready=True))
    # Another Service's slice in the same namespace must not leak in.
    discovery.create_namespaced_endpoint_slice(
        namespace, endpoint_slice("other", "192.0.2.99", ready=True, service="other")
    )
    seen: list[list[str]] = []
    changed = asyncio.Event()

    def on_change(urls: list[str]) -> None:
        seen.append(urls)
        changed.set()

    async def next_urls() -> list[str]:
        await asyncio.wait_for(changed.wait(), timeout=30)
        changed.clear()
        return seen[-1]

    kubeconfig = local_cluster.service_account_kubeconfig(namespace, "router")
    sa_client = config.new_client_from_config(config_file=str(kubeconfig))
    watch = EndpointSliceWatch(namespace, SERVICE, on_change, asyncio.get_running_loop(), api_client=sa_client)
    watch.start()
    try:
        assert await next_urls() == ["http://192.0.2.10:8000"]
        discovery.create_namespaced_endpoint_slice(namespace, endpoint_slice("b", "192.0.2.11", ready=True))
        assert await next_urls() == ["http://192.0.2.10:8000", "http://192.0.2.11:8000"]
        # each URL names its Pod (targetRef): how the router finds that pod's sidecar report
        assert watch.targets == {"http://192.0.2.10:8000": "pod-a", "http://192.0.2.11:8000": "pod-b"}
        discovery.replace_namespaced_endpoint_slice("a", namespace, endpoint_slice("a", "192.0.2.10", ready=False))
        assert await next_urls() == ["http://192.0.2.11:8000"]
        discovery.delete_namespaced_endpoint_slice("b", namespace)
        assert await next_urls() == []
    finally:
        watch.stop()
        sa_client.close()
    return seen


def test_watch_follows_ready_endpoints_of_one_service(
    local_cluster: LocalCluster, router_namespace: tuple[str, Any]
) -> None:
    namespace, api = router_namespace
    seen = asyncio.run(_follow(local_cluster, namespace, api))
    assert all("192.0.2.99" not in url for urls in seen for url in urls)
