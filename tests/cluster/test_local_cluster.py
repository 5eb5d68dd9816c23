"""The local control plane behaves like a real cluster with A100 nodes.

What the operator's tests rely on: the API answers, GPU nodes look like GFD-labelled nodes,
the scheduler honours `nvidia.com/gpu` and node selectors, kwok makes scheduled pods Ready,
ServiceAccount tokens carry exactly their RBAC, garbage collection follows ownerReferences,
and helm runs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.manifests import A100_40GB, A100_80GB, DEFAULT_NODES
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S
from lorapool_dev.cluster.versions import HELM_VERSION, KUBERNETES_VERSION, binary
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.cluster
# Each timeout adds CLUSTER_START_S: whichever test runs first also pays for starting the
# session's cluster (~12 s here, more on a loaded machine).

NODES_80GB = {n.name for n in DEFAULT_NODES if n.gpu_product == A100_80GB}


def gpu_pod_spec(product: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "nodeSelector": {"nvidia.com/gpu.product": product},
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1", "memory": "4Gi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }


@pytest.mark.timeout(CLUSTER_START_S + 30)
def test_control_plane_answers_with_pinned_version(local_cluster: LocalCluster, api_client: Any) -> None:
    version: Any = client.VersionApi(api_client).get_code()
    assert version.git_version == KUBERNETES_VERSION
    core: Any = client.CoreV1Api(api_client)
    namespaces = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= namespaces
    readyz = local_cluster.kubectl("get", "--raw", "/readyz?verbose")
    assert "readyz check passed" in readyz.stdout


@pytest.mark.timeout(CLUSTER_START_S + 30)
def test_fake_nodes_carry_gfd_labels_and_gpu_capacity(api_client: Any) -> None:
    core: Any = client.CoreV1Api(api_client)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) >= {n.name for n in DEFAULT_NODES}
    expected = {
        "gpu-a100-80gb-0": (A100_80GB, "81920"),
        "gpu-a100-80gb-1": (A100_80GB, "81920"),
        "gpu-a100-40gb-0": (A100_40GB, "40960"),
    }
    for name, (product, memory) in expected.items():
        node = nodes[name]
        assert node.metadata.labels["nvidia.com/gpu.product"] == product
        assert node.metadata.labels["nvidia.com/gpu.memory"] == memory
        assert node.metadata.labels["nvidia.com/gpu.count"] == "8"
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
    cpu_node = nodes["cpu-0"]
    assert "nvidia.com/gpu" not in cpu_node.status.allocatable
    assert "nvidia.com/gpu.product" not in cpu_node.metadata.labels
    for node in nodes.values():
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", node.metadata.name


@pytest.mark.timeout(CLUSTER_START_S + 90)
def test_gpu_deployment_runs_only_on_80gb_nodes(api_client: Any, namespace: str) -> None:
    apps: Any = client.AppsV1Api(api_client)
    core: Any = client.CoreV1Api(api_client)
    replicas = 10  # more than one node's 8 GPUs: both 80GB nodes fill, the 40GB one never
    labels = {"app": "vllm-80gb"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "vllm-80gb"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": gpu_pod_spec(A100_80GB)},
            },
        },
    )

    def ready_replicas() -> bool:
        status = apps.read_namespaced_deployment_status("vllm-80gb", namespace).status
        return bool(status.ready_replicas == replicas)

    wait_until("10 ready replicas", ready_replicas, timeout_s=60)
    pods = core.list_namespaced_pod(namespace, label_selector="app=vllm-80gb").items
    assert len(pods) == replicas
    assert {p.spec.node_name for p in pods} == NODES_80GB
    for pod in pods:
        assert pod.status.phase == "Running"
        assert pod.status.pod_ip
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"


@pytest.mark.timeout(CLUSTER_START_S + 60)
@pytest.mark.parametrize(
    ("product", "gpus"),
    [("NVIDIA-H100-80GB-HBM3", 1), (A100_80GB, 9)],
    ids=["product-not-in-cluster", "more-gpus-than-a-node-has"],
)
def test_unsatisfiable_gpu_pod_stays_pending(api_client: Any, namespace: str, product: str, gpus: int) -> None:
    core: Any = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, {"metadata": {"name": "wants-gpu"}, "spec": gpu_pod_spec(product, gpus)})

    def unschedulable() -> bool:
        pod = core.read_namespaced_pod("wants-gpu", namespace)
        conditions = {c.type: c for c in pod.status.conditions or []}
        scheduled = conditions.get("PodScheduled")
        return bool(scheduled and scheduled.reason == "Unschedulable")

    wait_until("PodScheduled=False reason=Unschedulable", unschedulable, timeout_s=30)
    pod = core.read_namespaced_pod("wants-gpu", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


@pytest.mark.timeout(CLUSTER_START_S + 60)
def test_service_account_token_kubeconfig_has_exactly_its_rbac(
    local_cluster: LocalCluster, api_client: Any, namespace: str
) -> None:
    core: Any = client.CoreV1Api(api_client)
    rbac: Any = client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )

    path = local_cluster.service_account_kubeconfig(namespace, "reader")
    sa_client = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
    try:
        authn: Any = client.AuthenticationV1Api(sa_client)
        review = authn.create_self_subject_review({})
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:reader"
        sa_core: Any = client.CoreV1Api(sa_client)
        assert sa_core.list_namespaced_pod(namespace).items == []
        denied: list[Callable[[], Any]] = [
            lambda: sa_core.list_namespaced_pod("default"),
            lambda: sa_core.list_node(),
            lambda: sa_core.list_namespaced_secret(namespace),
            lambda: sa_core.create_namespaced_pod(
                namespace, {"metadata": {"name": "x"}, "spec": gpu_pod_spec(A100_80GB)}
            ),
        ]
        for call in denied:
            with pytest.raises(ApiException) as err:
                call()
            assert err.value.status == 403
    finally:
        sa_client.close()
    kubectl_denied = local_cluster.kubectl(
        "auth", "can-i", "delete", "pods", "-n", namespace, kubeconfig=path, check=False
    )
    assert kubectl_denied.stdout.strip() == "no"


@pytest.mark.timeout(CLUSTER_START_S + 60)
def test_garbage_collector_deletes_dependents(api_client: Any, namespace: str) -> None:
    core: Any = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "dependent",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
                ],
            }
        },
    )
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def dependent_gone() -> bool:
        names = {c.metadata.name for c in core.list_namespaced_config_map(namespace).items}
        return "dependent" not in names

    wait_until("the dependent ConfigMap to be collected", dependent_gone, timeout_s=30)


@pytest.mark.timeout(CLUSTER_START_S + 60)
def test_service_gets_endpoints_from_kwok_pod_ips(api_client: Any, namespace: str) -> None:
    apps: Any = client.AppsV1Api(api_client)
    core: Any = client.CoreV1Api(api_client)
    discovery: Any = client.DiscoveryV1Api(api_client)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": "cpu-0"},
                        "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}],
                    },
                },
            },
        },
    )
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 80}]},
        },
    )

    def ready_endpoints() -> list[str]:
        slices = discovery.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=web"
        ).items
        return [address for s in slices for e in s.endpoints or [] if e.conditions.ready for address in e.addresses]

    wait_until("2 ready endpoints", lambda: len(ready_endpoints()) == 2, timeout_s=45)
    assert all(a.startswith("10.244.") for a in ready_endpoints())


@pytest.mark.timeout(CLUSTER_START_S + 60)
def test_helm_runs_and_installs_a_chart(local_cluster: LocalCluster, namespace: str, tmp_path: Any) -> None:
    helm = str(binary("helm"))
    version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=True, timeout=30)
    assert version.stdout.startswith(HELM_VERSION)

    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    (chart / "values.yaml").write_text("greeting: hello\n")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "KUBECONFIG": str(local_cluster.kubeconfig)}
    subprocess.run(
        [helm, "install", "demo", str(chart), "-n", namespace, "--wait", "--timeout", "30s"],
        capture_output=True,
        text=True,
        check=True,
        timeout=45,
        env=env,
    )
    cm = local_cluster.kubectl("get", "configmap", "demo-cm", "-n", namespace, "-o", "jsonpath={.data.greeting}")
    assert cm.stdout == "hello"


@pytest.mark.timeout(CLUSTER_START_S + 60)
def test_deleting_a_deployment_removes_its_pods(api_client: Any, namespace: str) -> None:
    """No kubelet finishes pod deletion here: kwok's pod-delete stage must, or rollouts and
    namespace deletion would hang on Terminating pods."""
    apps: Any = client.AppsV1Api(api_client)
    core: Any = client.CoreV1Api(api_client)
    labels = {"app": "gone"}
    spec = gpu_pod_spec(A100_80GB) | {"terminationGracePeriodSeconds": 30}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "gone"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": spec},
            },
        },
    )

    def pods() -> list[Any]:
        return list(core.list_namespaced_pod(namespace, label_selector="app=gone").items)

    wait_until("2 running pods", lambda: sum(p.status.phase == "Running" for p in pods()) == 2)
    apps.delete_namespaced_deployment("gone", namespace, propagation_policy="Foreground")
    wait_until("the pods to be gone", lambda: not pods(), timeout_s=45)
    wait_until("the ReplicaSet to be gone", lambda: not apps.list_namespaced_replica_set(namespace).items)


@pytest.mark.timeout(CLUSTER_START_S + 60)
def test_crd_cel_validation_rules_are_enforced(api_client: Any, namespace: str) -> None:
    """The operator's CRDs use x-kubernetes-validations; this apiserver evaluates them."""
    ext: Any = client.ApiextensionsV1Api(api_client)
    group, plural = f"{namespace}.lorapool.test", "widgets"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
            }
        },
    }
    ext.create_custom_resource_definition(
        {
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": "widget", "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": schema},
                    }
                ],
            },
        }
    )
    try:

        def established() -> bool:
            crd = ext.read_custom_resource_definition(f"{plural}.{group}")
            return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

        wait_until("the CRD to be established", established)
        custom: Any = client.CustomObjectsApi(api_client)

        def create(low: int, high: int) -> Any:
            body = {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": f"w-{low}-{high}"},
                "spec": {"min": low, "max": high},
            }
            return custom.create_namespaced_custom_object(group, "v1", namespace, plural, body)

        create(1, 2)
        with pytest.raises(ApiException) as err:
            create(3, 2)
        assert err.value.status == 422
        assert "min must not exceed max" in str(err.value.body)
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{group}")
