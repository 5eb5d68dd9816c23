"""Watches the EndpointSlices of one Service and reports the ready backend URLs.

Uses the official ``kubernetes`` client in a daemon thread (its watch is blocking): list, then
watch from the list's resourceVersion; a 410 Gone or a dropped watch re-lists. Each change
calls ``on_change(urls)`` on the event loop. Config: in-cluster, else KUBECONFIG / ~/.kube.
RBAC needed: get/list/watch on ``endpointslices.discovery.k8s.io`` in the namespace.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from lorapool.router.discovery import SERVICE_NAME_LABEL, backend_urls

log = logging.getLogger("lorapool.router.endpointslices")

WATCH_TIMEOUT_S = 300  # server-side watch timeout: a silent stall is re-listed at least this often
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


def parse_target(target: str) -> tuple[str, str]:
    """``NAMESPACE/SERVICE`` -> (namespace, service); ValueError says the expected form."""
    namespace, sep, service = target.partition("/")
    if not sep or not namespace or not service or "/" in service:
        raise ValueError(f"--endpointslices={target!r} must be NAMESPACE/SERVICE, e.g. ml/pool-engine")
    return namespace, service


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
        self.on_change, self.loop, self.port_name = on_change, loop, port_name
        self.api_client = api_client
        self.synced = threading.Event()  # set after the first successful list
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"endpointslices-{namespace}-{service}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _publish(self, slices: dict[str, dict[str, Any]]) -> None:
        urls = backend_urls(slices.values(), port_name=self.port_name)
        if not self._stop.is_set():
            self.loop.call_soon_threadsafe(self.on_change, urls)

    def _run(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.rest import ApiException

        from lorapool.kubeconfig import api_client as kube_api_client

        api_client = self.api_client or kube_api_client()
        api = client.DiscoveryV1Api(api_client)
        selector = f"{SERVICE_NAME_LABEL}={self.service}"
        failures = 0
        while not self._stop.is_set():
            try:
                listed = api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                slices = {item.metadata.name: api_client.sanitize_for_serialization(item) for item in listed.items}
                self._publish(slices)
                self.synced.set()
                failures = 0
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                ):
                    if self._stop.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        break  # e.g. 410 Gone as an event: re-list
                    name = obj.metadata.name
                    if kind == "DELETED":
                        slices.pop(name, None)
                    else:
                        slices[name] = api_client.sanitize_for_serialization(obj)
                    self._publish(slices)
            except ApiException as exc:
                if exc.status != 410:
                    failures += 1
                    log.warning("Failed to watch EndpointSlices", extra={"status": exc.status})
            except Exception as exc:  # network errors of any library layer: back off, re-list
                failures += 1
                log.warning("Failed to watch EndpointSlices", extra={"error": repr(exc)})
            if failures:
                self._stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])
