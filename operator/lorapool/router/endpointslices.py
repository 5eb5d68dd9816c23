"""Watches the EndpointSlices of one Service and reports the ready backend URLs.

A ``kubewatch.ListWatch`` of ``discovery.k8s.io/v1`` EndpointSlices labelled
``kubernetes.io/service-name=SERVICE``; each change calls ``on_change(urls)`` on the event loop,
after ``targets`` (URL -> the Pod behind it, from the endpoints' ``targetRef``) is updated, so
the router can find each backend's sidecar report. RBAC needed: get/list/watch on
``endpointslices.discovery.k8s.io`` in the namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from lorapool.router.core.discovery import SERVICE_NAME_LABEL, backend_targets, backend_urls
from lorapool.router.kubewatch import ListWatch


def parse_target(target: str) -> tuple[str, str]:
    """``NAMESPACE/SERVICE`` -> (namespace, service); ValueError says the expected form."""
    namespace, sep, service = target.partition("/")
    if not sep or not namespace or not service or "/" in service:
        raise ValueError(f"--endpointslices={target!r} must be NAMESPACE/SERVICE, e.g. ml/pool-engine")
    return namespace, service


def _list_slices(api: Any) -> Callable[..., Any]:
    from kubernetes import client

    return client.DiscoveryV1Api(api).list_namespaced_endpoint_slice


class EndpointSliceWatch:
    """Keeps ``on_change`` informed of the Service's ready endpoints."""

    def __init__(
        self,
        namespace: str,
        service: str,
        on_change: Callable[[list[str]], None],
        loop: asyncio.AbstractEventLoop,
        *,
        port_name: str | None = None,
        api_client: Any = None,
    ) -> None:
        self.namespace, self.service = namespace, service
        self.on_change, self.port_name = on_change, port_name
        self.targets: dict[str, str] = {}  # backend URL -> pod name (endpoints with a Pod targetRef)
        self._watch = ListWatch(
            "EndpointSlices",
            _list_slices,
            namespace,
            f"{SERVICE_NAME_LABEL}={service}",
            lambda obj: obj,
            self._publish,
            loop,
            api_client=api_client,
        )
        self.synced = self._watch.synced

    def start(self) -> None:
        self._watch.start()

    def stop(self) -> None:
        self._watch.stop()

    def _publish(self, slices: dict[str, dict[str, Any]]) -> None:
        self.targets = backend_targets(slices.values(), port_name=self.port_name)
        self.on_change(backend_urls(slices.values(), port_name=self.port_name))
