"""An in-cluster HTTP server of small real PEFT adapters, for clusters without internet access.

Used by the e2e suite and `lorapool dev --node real`: a Deployment of the lorapool image writes the
adapters (`lorapool_dev.testing.peft`) into an emptyDir and serves them over HTTP, behind a Service.
The image carries lorapool alone, not this dev wing, so the writer's source travels in the
container's command (`command`) and runs against the image's lorapool. Pure builders; the
callers apply them. Sources point at the Service's ClusterIP (`sources`),
not its DNS name: the suite's real node runs no cluster DNS.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lorapool_dev.testing import peft

NAME = "adapters"
PORT = 8000
LABELS = {"app.kubernetes.io/name": "e2e-adapters"}

SCRIPT = """
import functools, http.server, pathlib, sys
writer = {{"__name__": "lorapool_dev_peft"}}
exec({writer!r}, writer)
root = pathlib.Path({root!r})
for name, rank in {adapters!r}.items():
    shapes = writer["base_module_shapes"]({base!r})  # the base's shapes: the sidecars verify against them
    writer["write_peft_adapter"](root / name, rank=rank, base_model={base!r}, module_shapes=shapes)
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
print("serving adapters", flush=True)
http.server.ThreadingHTTPServer(({host!r}, {port}), handler).serve_forever()
"""


def command(
    adapters: Mapping[str, int], base_model: str, *, root: str = "/tmp/adapters", host: str = "", port: int = PORT
) -> list[str]:
    """The server's command: write the adapters with the PEFT writer's own source (it imports only
    lorapool, which the image has), then serve ``root`` over HTTP on ``host:port``."""
    script = SCRIPT.format(
        writer=inspect.getsource(peft), root=root, adapters=dict(adapters), base=base_model, host=host, port=port
    )
    return ["python", "-c", script]


def manifests(namespace: str, image: str, adapters: Mapping[str, int], base_model: str) -> list[dict[str, Any]]:
    """The Deployment (non-root, read-only root, /tmp an emptyDir, ready once the first adapter
    is written) and its Service."""
    first = next(iter(adapters))
    container = {
        "name": "http",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command(adapters, base_model),
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
