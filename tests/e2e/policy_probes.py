"""Probe pods for the NetworkPolicy tests: idle pods with chosen labels in chosen namespaces, from
which a TCP connect (or a call of the engine's LoRA API) says whether a policy admits them.

Used by tests/e2e/test_e2e.py (the pool's policies on a real cluster) and tests/node/test_netpol.py
(the enforcer on the suite's real node). The pods start once, together, and are probed with
`kubectl exec`, so each probe costs about a second (a refusal: its connect timeout more).

An enforcer refuses by dropping the connection's first packet: the probe then times out
(`TIMEOUT`). A connection refused by the peer (`ERROR`) means nothing listens there, not that a
policy refused it, so the tests tell the two apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from lorapool_dev.testing.wait import wait_until

Kubectl = Callable[..., Any]  # Target.kubectl or RealNode.kubectl: (*args, input_text=, check=, timeout_s=)

CONNECT_TIMEOUT_S = 3  # a SYN dropped while the enforcer did not know the probe's IP yet is resent after 1 s

CONNECT = """
import socket
try:
    socket.create_connection(({ip!r}, {port}), timeout={timeout_s}).close()
    print("REACHED")
except TimeoutError:
    print("TIMEOUT")
except OSError as exc:
    print("ERROR", exc)
"""

# The engine's runtime LoRA API, called as an attacker would: load any path as an adapter.
LOAD_LORA = """
import urllib.error, urllib.request
req = urllib.request.Request("http://{ip}:8000/v1/load_lora_adapter", method="POST",
    data=b'{{"lora_name": "evil", "lora_path": "/tmp"}}', headers={{"Content-Type": "application/json"}})
try:
    print("REACHED", urllib.request.urlopen(req, timeout={timeout_s}).status)
except urllib.error.HTTPError as exc:
    print("REACHED", exc.code)
except TimeoutError:
    print("TIMEOUT")
except OSError as exc:
    print("TIMEOUT" if "timed out" in str(exc) else "ERROR", exc)
"""


@dataclass(frozen=True)
class ProbePod:
    namespace: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)

    def manifest(self, image: str) -> dict[str, Any]:
        """An idle pod of `image` (python on PATH) that is never Ready: a probe wearing a router's
        labels must not become an endpoint of the router's Service."""
        container = {
            "name": "probe",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["python", "-c", "import signal; signal.pause()"],
            "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 60},
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
        }


def _running(kubectl: Kubectl, pod: ProbePod) -> bool:
    result = kubectl("get", "pod", pod.name, "-n", pod.namespace, "-o", "json", check=False, timeout_s=30)
    if result.returncode != 0:
        return False
    statuses = json.loads(result.stdout).get("status", {}).get("containerStatuses") or []
    return bool(statuses) and "running" in statuses[0].get("state", {})


def start(kubectl: Kubectl, pods: Sequence[ProbePod], image: str, timeout_s: float = 120) -> None:
    """Create the probe pods (and their namespaces) and wait until every one runs."""
    for namespace in sorted({p.namespace for p in pods}):
        kubectl("create", "namespace", namespace, check=False, timeout_s=30)
    docs = {"apiVersion": "v1", "kind": "List", "items": [p.manifest(image) for p in pods]}
    kubectl("apply", "-f", "-", input_text=json.dumps(docs), timeout_s=60)
    for pod in pods:
        wait_until(f"probe pod {pod.namespace}/{pod.name} running", partial(_running, kubectl, pod), timeout_s)


def delete(kubectl: Kubectl, pods: Sequence[ProbePod]) -> None:
    for pod in pods:
        kubectl("delete", "pod", pod.name, "-n", pod.namespace, "--wait=false", "--ignore-not-found", check=False)


def _exec(kubectl: Kubectl, pod: ProbePod, script: str) -> str:
    result = kubectl(
        "exec", "-n", pod.namespace, pod.name, "--", "python", "-c", script, check=False, timeout_s=60
    )  # fmt: skip
    out = str(result.stdout).strip()
    return out if out else f"EXEC FAILED {result.returncode}: {str(result.stderr).strip()[:500]}"


def connect(kubectl: Kubectl, pod: ProbePod, ip: str, port: int) -> str:
    """REACHED, TIMEOUT (a policy dropped it) or ERROR (refused: nothing listens), from `pod`."""
    return _exec(kubectl, pod, CONNECT.format(ip=ip, port=port, timeout_s=CONNECT_TIMEOUT_S))


def load_lora(kubectl: Kubectl, pod: ProbePod, ip: str) -> str:
    """What `pod` gets from an engine's POST /v1/load_lora_adapter: REACHED <status> or TIMEOUT."""
    return _exec(kubectl, pod, LOAD_LORA.format(ip=ip, timeout_s=CONNECT_TIMEOUT_S + 2))


def pod_ips(kubectl: Kubectl, namespace: str, selector: str, name_prefix: str) -> list[str]:
    """IPs of the Ready, not terminating pods matching `selector` whose names start with
    `name_prefix` (the Deployment's own, not a probe wearing its labels)."""
    out = kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json", timeout_s=30).stdout
    ips = []
    for item in json.loads(out)["items"]:
        conditions = item.get("status", {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        leaving = "deletionTimestamp" in item["metadata"]  # an old pod of a finished roll, still Ready a moment
        if ready and not leaving and item["metadata"]["name"].startswith(name_prefix) and item["status"].get("podIP"):
            ips.append(item["status"]["podIP"])
    return ips
