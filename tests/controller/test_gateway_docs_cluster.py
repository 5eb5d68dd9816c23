"""docs/gateway.md's manifests in the real API server, with Gateway API's own CRDs (from the Go
module proxy) and the InferencePool CRD: every Gateway and HTTPRoute a user copies is accepted, and
every HTTPRoute sends only the inference paths to the example pool's rendered InferencePool."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.gateway_api import gateway_api_crds
from tests.controller.conftest import install_inferencepool_crd

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "gateway.md"
EXAMPLES = REPO / "examples" / "gateway"
INFERENCE_PATHS = {"/v1/completions", "/v1/chat/completions", "/v1/models"}


def doc_manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


def example_manifests() -> list[dict[str, Any]]:
    return [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def test_every_route_sends_only_inference_paths_to_the_example_pools_inference_pool() -> None:
    (pool,) = [d for d in example_manifests() if d["kind"] == "LoRAPool"]
    routes = [d for d in [*doc_manifests(), *example_manifests()] if d["kind"] == "HTTPRoute"]
    assert len(routes) >= 5, "one per gateway in the doc, and the example"
    for route in routes:
        assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]
        for rule in route["spec"]["rules"]:
            assert rule["backendRefs"] == [
                {
                    "group": names.INFERENCE_POOL_GROUP,
                    "kind": "InferencePool",
                    "name": names.inference_pool(pool["metadata"]["name"]),
                }
            ]
            paths = {(m["path"]["type"], m["path"]["value"]) for m in rule["matches"]}
            assert paths == {("Exact", p) for p in INFERENCE_PATHS}, "never a prefix: port 8000 carries the LoRA API"
    (rule,) = [d for d in doc_manifests() if d["kind"] == "DestinationRule"]
    assert rule["spec"]["host"].startswith(names.endpoint_picker(pool["metadata"]["name"]) + ".")


def test_the_api_server_accepts_every_gateway_and_route_of_the_docs(
    local_cluster: LocalCluster,
    operator_env: Path,
    no_inferencepool_crd: None,
) -> None:
    for crd in gateway_api_crds():
        local_cluster.kubectl("apply", "--server-side", "-f", str(crd))
    local_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/httproutes.gateway.networking.k8s.io",
        "crd/gateways.gateway.networking.k8s.io",
    )
    install_inferencepool_crd(local_cluster)
    local_cluster.kubectl("create", "namespace", "ml", check=False)
    checked = 0
    for doc in [*doc_manifests(), *example_manifests()]:
        if doc["apiVersion"].split("/")[0] not in ("gateway.networking.k8s.io", "lorapool.io"):
            continue  # an implementation's own kind (Istio's DestinationRule): not installed here
        result = local_cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(doc), check=False
        )
        assert result.returncode == 0, (doc["kind"], doc["metadata"]["name"], result.stderr)
        checked += 1
    assert checked >= 10
