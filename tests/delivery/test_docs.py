"""What the docs tell users to paste works: YAML parses and validates, the Argo CD plugin's
scripts render pools (and refuse bad ones), and the values the install guide names exist."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.models import LoRAPool
from tests.delivery.helm import CHART, REPO

DOCS = REPO / "docs"
CMP = DOCS / "argocd-cmp-plugin.yaml"


def yaml_blocks(path: Path) -> list[dict[str, Any]]:
    return [d for b in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S) for d in yaml.safe_load_all(b) if d]


@pytest.mark.parametrize("doc", ["gitops.md", "install.md"])
def test_yaml_in_docs_is_valid(doc: str) -> None:
    import kubernetes_validate

    for obj in yaml_blocks(DOCS / doc):
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        if obj["kind"] == "LoRAPool":
            LoRAPool.model_validate(obj)
        elif group == "" or group.endswith(".k8s.io") or group in ("apps", "batch", "policy"):
            kubernetes_validate.validate(obj, "1.36.0", strict=True)
        else:
            assert obj["kind"] in {"Application", "GitRepository", "HelmRelease", "Kustomization"}, obj["kind"]


def test_install_guide_names_only_values_the_chart_has() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    text = (DOCS / "install.md").read_text()
    rows = re.findall(r"^\| (`[^|]+`) \|", text, re.M)
    keys = [k for row in rows for k in re.findall(r"`([a-zA-Z.]+)`", row)]
    assert "replicaCount" in keys and "watchNamespaces" in keys
    for key in keys:
        node = schema
        for part in key.split("."):
            assert part in node.get("properties", {}), f"docs/install.md names {key}, which values.schema.json lacks"
            node = node["properties"][part]


def cmp_plugin() -> tuple[dict[str, Any], dict[str, Any]]:
    configmap, patch = yaml.safe_load_all(CMP.read_text())
    return configmap, patch


def test_cmp_manifests_validate() -> None:
    import kubernetes_validate

    configmap, patch = cmp_plugin()
    kubernetes_validate.validate(configmap, "1.36.0", strict=True)
    labels = {"app.kubernetes.io/name": "argocd-repo-server"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "argocd-repo-server"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, **patch["spec"]["template"]},
        },
    }
    kubernetes_validate.validate(deployment, "1.36.0", strict=True)
    plugin = yaml.safe_load(configmap["data"]["plugin.yaml"])
    assert plugin["kind"] == "ConfigManagementPlugin" and plugin["metadata"]["name"] == "lorapool-render"


def run_step(step: dict[str, Any], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a plugin step as Argo CD's cmp-server does: command + args in the app's directory."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `lorapool` next to this Python
    return subprocess.run(
        [*step["command"], *step.get("args", [])],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path, **env},
        check=False,
    )


def test_cmp_plugin_renders_the_pools_of_a_directory(tmp_path: Path) -> None:
    plugin = yaml.safe_load(cmp_plugin()[0]["data"]["plugin.yaml"])
    assert run_step(plugin["spec"]["discover"]["find"], tmp_path).stdout == ""
    shutil.copy(REPO / "examples" / "lorapool.yaml", tmp_path / "pool.yaml")
    (tmp_path / "other.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n")
    assert run_step(plugin["spec"]["discover"]["find"], tmp_path).stdout.strip() == "./pool.yaml"

    result = run_step(plugin["spec"]["generate"], tmp_path, ARGOCD_ENV_LORAPOOL_IMAGE="registry.example/lorapool:1")
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]  # stdout is nothing but YAML
    names = {(d["kind"], d["metadata"]["name"]) for d in objects}
    assert {
        ("Deployment", "llama3-8b-engine"),
        ("Deployment", "llama3-8b-router"),
        ("Service", "llama3-8b"),
        ("ConfigMap", "llama3-8b-adapters"),
    } <= names
    router = next(d for d in objects if (d["kind"], d["metadata"]["name"]) == ("Deployment", "llama3-8b-router"))
    assert router["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/lorapool:1"


def test_cmp_plugin_fails_the_sync_on_a_bad_pool(tmp_path: Path) -> None:
    plugin = yaml.safe_load(cmp_plugin()[0]["data"]["plugin.yaml"])
    bad = (REPO / "examples" / "lorapool.yaml").read_text().replace("rank: 16", "rank: 600")
    (tmp_path / "pool.yaml").write_text(bad)
    result = run_step(plugin["spec"]["generate"], tmp_path)
    assert result.returncode != 0 and result.stdout == ""
    assert "spec.adapters[0].rank" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_step(plugin["spec"]["generate"], empty)
    assert result.returncode != 0 and "no LoRAPool YAML" in result.stderr
