"""An in-cluster HTTP server of small real PEFT adapters, for clusters without internet access.

Used by the e2e suite and `lorapool dev --node real`: a Deployment of the lorapool image writes the
adapters (`lorapool_dev.testing.peft`) into an emptyDir and serves them over HTTP, behind a Service.
Pure builders; the callers apply them. Sources point at the Service's ClusterIP (`sources`),
not its DNS name: the suite's real node runs no cluster DNS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NAME = "adapters"
PORT = 8000
LABELS = {"app.kubernetes.io/name": "e2e-adapters"}

SCRIPT = """
import functools, http.server, pathlib, sys
from lorapool_dev.testing.peft import write_peft_adapter
root = pathlib.Path("/tmp/adapters")
for name, rank in {adapters!r}.items():
    write_peft_adapter(root / name, rank=rank, base_model={base!r})
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
print("serving adapters", flush=True)
http.server.ThreadingHTTPServer(("", {port}), handler).serve_forever()
"""


def manifests(namespace: str, image: str, adapters: Mapping[str, int], base_model: str) -> list[dict[str, Any]]:
    """The Deployment (non-root, read-only root, /tmp an emptyDir, ready once the first adapter
    is written) and its Service."""
    first = next(iter(adapters))
    container = {
        "name": "http",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-c", SCRIPT.format(adapters=dict(adapters), base=base_model, port=PORT)],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": f"/{first}/adapter_config.json", "port": "http"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {
                "selector": {"matchLabels": LABELS},
                "template": {"metadata": {"labels": LABELS}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {"selector": LABELS, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
        },
    ]


def sources(cluster_ip: str, adapters: Mapping[str, int]) -> dict[str, str]:
    """Adapter name -> the URL the operator and the sidecars download it from."""
    return {name: f"http://{cluster_ip}:{PORT}/{name}" for name in adapters}
