"""The operator's only Kubernetes I/O: server-side apply of children, reads, status patches.

Thin shell over the official client (blocking; callers run it in a thread). Each child
carries ``lorapool.io/applied-hash``: when the live object still has our hash and every
field we set, nothing is sent, so a resync of an unchanged pool writes nothing. Every
write is counted in ``lorapool_operator_writes_total``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

from lorapool.api.clock import rfc3339
from lorapool.api.models import GROUP, VERSION
from lorapool.render.names import FIELD_MANAGER

APPLIED_HASH = "lorapool.io/applied-hash"
LIST_PAGE = 500  # objects per list request (client-go's reflector pages by 500 too)

WRITES = Counter("lorapool_operator_writes_total", "Writes the operator sent to the API server", ["kind", "verb"])

# kind -> (API prefix, plural); every kind the renderer emits is namespaced.
_PATHS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Pod": ("/api/v1", "pods"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "LoRAPool": (f"/apis/{GROUP}/{VERSION}", "lorapools"),
    "LoRAAdapter": (f"/apis/{GROUP}/{VERSION}", "loraadapters"),
    # The Gateway API Inference Extension's, applied only while served (controller.gateway).
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
}


def object_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field of ``desired`` is in ``live`` with the same value (lists by position)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and is_subset(v, live[k]) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(desired) == len(live) and all(map(is_subset, desired, live))
    return bool(desired == live)


class Kube:
    """Blocking API access for the reconcile; one instance per operator process."""

    def __init__(self, api: client.ApiClient, identity: str = "") -> None:
        self.api = api
        # This operator replica (its pod name): each Event says which replica posted it, so two
        # operators reconciling one pool (two releases watching one namespace) show in `kubectl get events`.
        self.identity = identity

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        method, url, headers, data, post = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method, url, header_params=headers, body=data, post_params=post, _request_timeout=30
        )
        raw = cast(Callable[[], bytes], response.read)()  # RESTResponse.read is unannotated; it returns the body
        if response.status >= 400:
            raise ApiException(status=response.status, reason=response.reason, body=raw.decode(errors="replace"))
        return json.loads(raw or b"null")

    def path(self, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        prefix, plural = _PATHS[kind]
        path = f"{prefix}/namespaces/{namespace}/{plural}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    def serves(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group_version`` (discovery): a CRD may be absent."""
        try:
            found = self._call("GET", f"/apis/{group_version}")
        except ApiException as exc:
            if exc.status in (404, 503):  # not installed, or installed with no ready server yet
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or ())

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._call("GET", self.path(kind, namespace, name))
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, kind: str, namespace: str, selector: str | None = None, resource_version: str | None = None
    ) -> list[dict[str, Any]]:
        """The objects of ``kind`` in ``namespace``, without ``metadata.managedFields`` (nothing here reads
        them, and they are often half an object); ``resource_version="0"`` lets the API server answer from
        its watch cache (any recent state, no etcd read: the initial list of ``controller.index``).

        Read in pages of ``LIST_PAGE`` objects, as client-go's reflector does: a namespace of 10,000
        LoRAAdapters in one response was a 40 MB body and its decoded copy in memory at once, the
        operator's peak. (A server that answers from its cache without paging sends one page.)"""
        base = [("labelSelector", selector)] if selector else []
        first = [("resourceVersion", resource_version)] if resource_version is not None else []
        items: list[dict[str, Any]] = []
        token = ""
        while True:  # a continue token carries the snapshot: the API server refuses a resourceVersion beside it
            query = [*base, ("limit", str(LIST_PAGE)), *([("continue", token)] if token else first)]
            page = self._call("GET", self.path(kind, namespace), query=query)
            for obj in page.get("items") or []:
                (obj.get("metadata") or {}).pop("managedFields", None)
                items.append(obj)
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def apply(self, obj: dict[str, Any]) -> bool:
        """Server-side apply ``obj`` unless the live object already matches; True if written."""
        meta = obj["metadata"]
        digest = object_hash(obj)
        desired = {
            **obj,
            "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), APPLIED_HASH: digest}},
        }
        live = self.get(obj["kind"], meta["namespace"], meta["name"])
        if (
            live is not None
            and (live["metadata"].get("annotations") or {}).get(APPLIED_HASH) == digest
            and is_subset(obj, live)
        ):
            return False
        self._call(
            "PATCH",
            self.path(obj["kind"], meta["namespace"], meta["name"]),
            body=desired,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )
        WRITES.labels(obj["kind"], "apply").inc()
        return True

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete one object, only while it is still the one read (``uid`` precondition); gone is fine."""
        try:
            self._call("DELETE", self.path(kind, namespace, name), body={"preconditions": {"uid": uid}})
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
        WRITES.labels(kind, "delete").inc()

    def annotate(self, kind: str, namespace: str, name: str, annotations: Mapping[str, str | None]) -> bool:
        """Merge-patch ``annotations`` onto an object (None removes one); the placement slots of engine pods.
        False when the object is gone (a pod deleted by a rollout since it was listed): nothing to annotate."""
        try:
            self._call(
                "PATCH",
                self.path(kind, namespace, name),
                body={"metadata": {"annotations": dict(annotations)}},
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        WRITES.labels(kind, "annotate").inc()
        return True

    def patch_status(self, kind: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._call(
            "PATCH",
            self.path(kind, namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )
        WRITES.labels(kind, "status").inc()

    def event(self, involved: Mapping[str, Any], *, reason: str, message: str, type_: str = "Normal") -> None:
        """Record a core/v1 Event on ``involved`` (a pool or adapter), stamped so `kubectl describe`
        and `kubectl get events` show its age."""
        meta = involved["metadata"]
        now = rfc3339(time.time())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": FIELD_MANAGER, **({"host": self.identity} if self.identity else {})},
            "reportingComponent": FIELD_MANAGER,
            **({"reportingInstance": self.identity} if self.identity else {}),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)
        WRITES.labels("Event", "create").inc()
