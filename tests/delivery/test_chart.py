"""The Helm chart rendered by the real helm CLI: lint, Kubernetes schemas, RBAC parity with
deploy/rbac.yaml, admission-policy parity with deploy/admission-policy.yaml, CRD parity with
crds/, image and version consistency, values schema."""

from __future__ import annotations

import filecmp
import json
from typing import Any

import pytest
import yaml

import lorapool
from lorapool.api.models import DEFAULT_LORAPOOL_IMAGE
from tests.delivery.helm import CHART, REPO, find, helm, one, template

OPERATOR = "lorapool-operator"

# Value sets every rendering check runs on: the default and each switch that changes objects.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "single-replica": {"replicaCount": 1},
    "no-leader-election": {"replicaCount": 1, "leaderElection.enabled": False},
    "watch-namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "service-monitor": {"serviceMonitor.enabled": True, "serviceMonitor.labels": {"release": "prom"}},
    "digest-and-workload-image": {
        "image.digest": "sha256:" + "a" * 64,
        "workloadImage": "registry.example/lorapool:custom",
    },
    "own-service-account": {"serviceAccount.create": False, "serviceAccount.name": "ops-sa"},
    "no-admission-policy": {"admissionPolicy.enabled": False},
    "scheduling": {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {}},
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
            }
        ],
        "extraArgs": ["--metadata-timeout-seconds=20"],
        "extraEnv": [{"name": "HF_ENDPOINT", "value": "https://hf.example"}],
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "regcred"}],
    },
}


def _rbac_rules(kind: str) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text())
    return next(d for d in docs if d["kind"] == kind)["rules"]


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(docs, "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"]
    return container


def test_chart_crds_are_byte_identical_to_the_generated_ones() -> None:
    """helm installs charts/lorapool/crds/ verbatim; a drift from crds/ ships a stale API."""
    names = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert names and sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == names
    _, mismatch, errors = filecmp.cmpfiles(REPO / "crds", CHART / "crds", names, shallow=False)
    assert not mismatch and not errors, (
        f"charts/lorapool/crds differ: {mismatch + errors}; run `lorapool crds --out charts/lorapool/crds`"
    )


@pytest.mark.parametrize("values", [{}, {"serviceMonitor.enabled": True}], ids=["defaults", "service-monitor"])
def test_helm_lint_strict_is_clean(values: dict[str, Any]) -> None:
    args = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    result = helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in result.stdout and "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_rendered_objects_validate_against_kubernetes_schemas(values: dict[str, Any]) -> None:
    import kubernetes_validate

    docs = template(values)
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "Role", "RoleBinding"} <= kinds
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD kind the validator cannot know; checked by test_service_monitor below
        kubernetes_validate.validate(doc, "1.36.0", strict=True)


def test_rbac_rules_equal_deploy_rbac_yaml() -> None:
    """The operator's integration tests run with deploy/rbac.yaml; the chart must grant exactly that."""
    docs = template()
    assert one(docs, "ClusterRole", OPERATOR)["rules"] == _rbac_rules("ClusterRole")
    assert one(docs, "Role", f"{OPERATOR}-leader")["rules"] == _rbac_rules("Role")
    binding = one(docs, "ClusterRoleBinding", OPERATOR)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": "lorapool-system"}]
    assert one(docs, "ServiceAccount", OPERATOR)["metadata"]["namespace"] == "lorapool-system"


POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def test_admission_policy_equals_deploy_admission_policy_yaml() -> None:
    """The kubectl path (deploy/) and the chart install the same policy and binding; the cluster test
    (tests/controller/test_admission_policy.py) applies deploy/'s copy."""
    deployed = [d for d in yaml.safe_load_all((REPO / "deploy" / "admission-policy.yaml").read_text()) if d]
    assert [d["kind"] for d in deployed] == list(POLICY_KINDS)
    rendered = [d for d in template() if d["kind"] in POLICY_KINDS]
    assert [d["kind"] for d in rendered] == list(POLICY_KINDS)
    for mine, theirs in zip(deployed, rendered, strict=True):
        assert mine["apiVersion"] == theirs["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert mine["metadata"]["name"] == theirs["metadata"]["name"] == "lorapool-own-pod-status"
        assert mine["spec"] == theirs["spec"], mine["kind"]
    policy, binding = rendered
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/status"]}
    ]


@pytest.mark.parametrize(
    ("values", "rendered"),
    [({}, True), ({"admissionPolicy.enabled": False}, False)],
    ids=["default-on", "disabled"],
)
def test_admission_policy_is_on_by_default_and_can_be_turned_off(values: dict[str, Any], rendered: bool) -> None:
    docs = template(values)
    for kind in POLICY_KINDS:
        assert len(find(docs, kind)) == (1 if rendered else 0), kind


def test_admission_policy_names_follow_the_release() -> None:
    """Cluster-scoped: two releases must not fight over one name."""
    docs = template(release="team-b")
    policy = one(docs, "ValidatingAdmissionPolicy")
    assert policy["metadata"]["name"] == "team-b-lorapool-own-pod-status"
    assert one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]


def test_watch_namespaces_get_the_same_rules_as_roles_and_no_cluster_grant() -> None:
    docs = template({"watchNamespaces": ["team-a", "team-b"]})
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    roles = {r["metadata"]["namespace"]: r["rules"] for r in find(docs, "Role", OPERATOR)}
    assert roles == {"team-a": _rbac_rules("ClusterRole"), "team-b": _rbac_rules("ClusterRole")}
    bindings = {b["metadata"]["namespace"]: b["subjects"] for b in find(docs, "RoleBinding", OPERATOR)}
    assert set(bindings) == {"team-a", "team-b"}
    assert all(
        s == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": "lorapool-system"}] for s in bindings.values()
    )
    args = _container(docs)["args"]
    assert args.count("--namespace=team-a") == 1 and args.count("--namespace=team-b") == 1


def test_default_image_is_the_release_image_the_renderer_uses() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == lorapool.__version__
    assert DEFAULT_LORAPOOL_IMAGE.endswith(f":{lorapool.__version__}")
    container = _container(template())
    assert container["image"] == DEFAULT_LORAPOOL_IMAGE
    assert f"--image={DEFAULT_LORAPOOL_IMAGE}" in container["args"]


def test_image_digest_wins_and_workload_image_overrides_only_routers_and_sidecars() -> None:
    container = _container(template(VALUE_SETS["digest-and-workload-image"]))
    assert container["image"] == "ghcr.io/lorapool/lorapool@sha256:" + "a" * 64
    assert "--image=registry.example/lorapool:custom" in container["args"]


def test_operator_deployment_is_ha_least_privilege_and_uses_the_operator_flags() -> None:
    docs = template()
    deployment = one(docs, "Deployment", OPERATOR)
    pod = deployment["spec"]["template"]["spec"]
    container = _container(docs)
    assert deployment["spec"]["replicas"] == 2
    assert container["args"][0] == "operator"
    for flag in (
        "--metrics-port=8080",
        "--liveness-port=8081",
        "--leader-election",
        "--leader-election-namespace=$(POD_NAMESPACE)",
        f"--leader-election-name={OPERATOR}",
        "--identity=$(POD_NAME)",
    ):
        assert flag in container["args"], flag
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    assert pod["serviceAccountName"] == OPERATOR
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
    assert one(docs, "PodDisruptionBudget", OPERATOR)["spec"]["minAvailable"] == 1
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    service = one(docs, "Service", f"{OPERATOR}-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert not find(docs, "ServiceMonitor")


@pytest.mark.parametrize(
    ("values", "probed"),
    [
        ({}, True),
        ({"replicaCount": 1}, True),
        ({"leaderElection.enabled": False}, True),
        ({"replicaCount": 1, "livenessProbe.enabled": False}, False),
    ],
    ids=["two-replicas-standby-probed", "one-replica", "no-leader-election", "disabled"],
)
def test_liveness_probe_on_every_replica_unless_disabled(values: dict[str, Any], probed: bool) -> None:
    """Standbys serve /healthz while they wait for the Lease, so every replica can be probed."""
    container = _container(template(values))
    assert ("livenessProbe" in container) is probed
    if probed:
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 15
    if values.get("leaderElection.enabled") is False:
        assert "--no-leader-election" in container["args"]


def test_service_monitor_selects_the_metrics_service() -> None:
    docs = template(VALUE_SETS["service-monitor"])
    monitor = one(docs, "ServiceMonitor", OPERATOR)
    service = one(docs, "Service", f"{OPERATOR}-metrics")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": -1}, "replicaCount"),
        ({"replicaCount": "two"}, "replicaCount"),
        ({"image.pullPolicy": "Sometimes"}, "pullPolicy"),
        ({"image.digest": "latest"}, "digest"),
        ({"logLevel": "TRACE"}, "logLevel"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"replicas": 2}, "replicas"),
        ({"serviceMonitor.interval": "soon"}, "interval"),
    ],
    ids=[
        "negative-replicas",
        "string-replicas",
        "pull-policy",
        "digest",
        "log-level",
        "bad-namespace",
        "unknown-key",
        "interval",
    ],
)
def test_values_schema_refuses_bad_values_naming_the_field(values: dict[str, Any], message: str) -> None:
    args = [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]
    result = helm("template", "x", str(CHART), *args, check=False)
    assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_service_monitor_without_metrics_service_is_refused() -> None:
    result = helm(
        "template",
        "x",
        str(CHART),
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "metrics.service.enabled=false",
        check=False,
    )
    assert result.returncode != 0 and "needs metrics.service.enabled" in result.stderr


def test_names_fit_kubernetes_limits_for_long_release_names() -> None:
    docs = template(release="r" * 53)  # helm's longest release name
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]


def test_values_schema_documents_every_default_value() -> None:
    """Every key in values.yaml is declared in values.schema.json (which forbids unknown keys)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], schema_node: dict[str, Any], path: str) -> None:
        assert schema_node.get("additionalProperties") is False or "properties" not in schema_node, path
        for key, value in node.items():
            props = schema_node.get("properties", {})
            assert key in props, f"{path}{key} is not in values.schema.json"
            if isinstance(value, dict) and "properties" in props[key]:
                walk(value, props[key], f"{path}{key}.")

    walk(values, schema, "")
