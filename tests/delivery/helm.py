"""The real helm CLI (built by `lorapool cluster build`) and the chart, for the delivery and e2e tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.versions import binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lorapool"


def helm_binary() -> Path:
    """The cached helm, else one on PATH (machines that run the e2e against their own cluster).
    Skips when there is none, except in CI (CI=true), where `.ci/run` builds it first."""
    if not build.missing(cache_root(), ["helm"]):
        return binary("helm")
    if on_path := shutil.which("helm"):
        return Path(on_path)
    message = "helm is not built; run scripts/build-control-plane"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def helm(
    *args: str, kubeconfig: Path | None = None, check: bool = True, timeout_s: float = 240.0
) -> subprocess.CompletedProcess[str]:
    """Run helm with its state (cache, config, repository data) kept out of $HOME."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": "/tmp/lorapool-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/lorapool-helm/config",
        "HELM_DATA_HOME": "/tmp/lorapool-helm/data",
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    result = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
    return result


def set_args(values: Mapping[str, Any]) -> list[str]:
    """`--set-json key=<json>` for each value: types survive (a list stays a list)."""
    import json

    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


def template(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "lorapool",
    namespace: str = "lorapool-system",
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart, parsed; the CRDs are included, as `helm install` applies them."""
    out = helm(
        "template", release, str(CHART), "--namespace", namespace, "--include-crds", *set_args(values or {}), *extra
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [dict(d) for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = find(docs, kind, name)
    return found
