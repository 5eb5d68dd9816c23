"""Pure parts of lorapool_dev.cluster: build inputs, node manifests, flags, certificates, stages.

No processes: these run everywhere, built binaries or not.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from lorapool_dev.cluster import build, manifests, pki
from lorapool_dev.cluster.manifests import A100_40GB, A100_80GB, DEFAULT_NODES, Layout, Ports
from lorapool_dev.cluster.versions import BY_NAME

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tgithub.com/spf13/cobra v1.10.2
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/kube-openapi v0.0.0-20260317180543-43fb72c5454a
\tk8s.io/streaming v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-cli-plugin => ./staging/src/k8s.io/sample-cli-plugin
\tk8s.io/streaming => ./staging/src/k8s.io/streaming
)
"""


def test_staging_modules_are_required_and_replaced_into_staging() -> None:
    # kube-openapi is pinned to a real pseudo-version; sample-cli-plugin is never required
    # (and not on the proxy at v0.36.3): neither gets a replace line.
    assert build.staging_modules(KUBERNETES_GO_MOD) == ["k8s.io/api", "k8s.io/client-go", "k8s.io/streaming"]


def test_kubernetes_wrapper_pins_staging_to_matching_v0_version() -> None:
    text = build.wrapper_go_mod(BY_NAME["kube-apiserver"], KUBERNETES_GO_MOD)
    assert "require k8s.io/kubernetes v1.36.3" in text
    assert "\tk8s.io/api => k8s.io/api v0.36.3" in text
    assert "sample-cli-plugin" not in text
    assert "\ngo 1.26.0\n" in text


def test_etcd_wrapper_has_no_replace() -> None:
    text = build.wrapper_go_mod(BY_NAME["etcd"], "module go.etcd.io/etcd/server/v3\n\ngo 1.26.0\n")
    assert "require go.etcd.io/etcd/server/v3 v3.6." in text
    assert "replace" not in text


def test_kubernetes_binaries_get_version_ldflags() -> None:
    flags = " ".join(BY_NAME["kube-scheduler"].ldflags)
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.3" in flags
    assert "-X k8s.io/component-base/version.gitMinor=36" in flags


@pytest.mark.parametrize(
    ("name", "product", "memory", "gpus"),
    [
        ("gpu-a100-80gb-0", A100_80GB, "81920", "8"),
        ("gpu-a100-80gb-1", A100_80GB, "81920", "8"),
        ("gpu-a100-40gb-0", A100_40GB, "40960", "8"),
        ("cpu-0", None, None, None),
    ],
    ids=["80gb-0", "80gb-1", "40gb", "cpu"],
)
def test_default_nodes_look_like_gfd_labelled_nodes(
    name: str, product: str | None, memory: str | None, gpus: str | None
) -> None:
    node = {n.name: n for n in DEFAULT_NODES}[name].manifest()
    labels = node["metadata"]["labels"]
    assert node["metadata"]["annotations"][manifests.KWOK_ANNOTATION] == "fake"
    assert labels.get("nvidia.com/gpu.product") == product
    assert labels.get("nvidia.com/gpu.memory") == memory
    assert labels.get("nvidia.com/gpu.count") == gpus
    assert node["status"]["capacity"].get("nvidia.com/gpu") == gpus
    assert node["status"]["allocatable"] == node["status"]["capacity"]


def test_every_component_binds_loopback_only() -> None:
    layout, ports = Layout(Path("/state")), Ports(2379, 2380, 6443, 10257, 10259)
    etcd = manifests.etcd_args(layout, ports)
    assert all("127.0.0.1" in a for a in etcd if a.startswith("--listen-"))
    assert "--unsafe-no-fsync=true" in etcd
    api = manifests.apiserver_args(layout, ports)
    assert {"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--authorization-mode=Node,RBAC"} <= set(api)
    for args in (manifests.controller_manager_args(layout, ports), manifests.scheduler_args(layout, ports)):
        assert "--bind-address=127.0.0.1" in args


def test_kubeconfig_uses_token_or_client_cert() -> None:
    with_token = manifests.kubeconfig("https://127.0.0.1:1", Path("/ca.crt"), "sa", token="t")
    assert with_token["users"][0]["user"] == {"token": "t"}
    with_cert = manifests.kubeconfig(
        "https://127.0.0.1:1", Path("/ca.crt"), "admin", cert_file=Path("/a.crt"), key_file=Path("/a.key")
    )
    assert with_cert["users"][0]["user"]["client-certificate"] == "/a.crt"


def test_client_certificate_carries_user_and_groups_and_is_signed_by_ca() -> None:
    ca = pki.new_ca()
    admin = pki.issue(ca, "lorapool-admin", ("system:masters",))
    cert = x509.load_pem_x509_certificate(admin.cert_pem)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))
    subject = {a.oid._name: a.value for a in cert.subject}
    assert subject == {"organizationName": "system:masters", "commonName": "lorapool-admin"}


def test_serving_certificate_names_loopback_and_the_kubernetes_service() -> None:
    ca = pki.new_ca()
    serving = pki.issue(ca, "kube-apiserver", server_names=("127.0.0.1", "kubernetes.default"))
    cert = x509.load_pem_x509_certificate(serving.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["kubernetes.default"]


def test_kwok_stages_cover_node_and_pod_lifecycles() -> None:
    text = resources.files("lorapool_dev.cluster").joinpath("stages.yaml").read_text()
    stages = {s["metadata"]["name"]: s["spec"]["resourceRef"]["kind"] for s in yaml.safe_load_all(text) if s}
    assert stages == {
        "node-initialize": "Node",
        "node-heartbeat-with-lease": "Node",
        "pod-ready": "Pod",
        "pod-complete": "Pod",
        "pod-delete": "Pod",
    }
