"""List, then watch, one kind of Kubernetes object in a namespace: the router's one informer.

Shell. The official ``kubernetes`` client's watch is blocking, so it runs in a daemon thread:
list (label selector), publish, watch from the list's resourceVersion, publish after every
event; a 410 Gone, an ERROR event, a dropped or silent watch (server timeout) re-lists; other
failures back off 0.5, 1, 2, 5, 10 s (and, for facts that mislead when stale, are forgotten
after a few: ``forget_after_failures``). Each object is turned into the router's own value by
``transform`` in that thread (decoding a sidecar's report stays off the event loop), and every
change hands ``publish`` a fresh ``{name: value}`` snapshot on the event loop. One watch per
kind per router. Config: in-cluster, else KUBECONFIG / ~/.kube (``lorapool.kubeconfig``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

log = logging.getLogger("lorapool.router.kubewatch")

WATCH_TIMEOUT_S = 300  # server-side watch timeout: a silent stall is re-listed at least this often
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)

T = TypeVar("T")


class ListWatch(Generic[T]):
    """Keeps ``publish`` informed of every object of one kind matching a label selector."""

    def __init__(
        self,
        kind: str,
        list_call: Callable[[Any], Callable[..., Any]],
        namespace: str,
        selector: str,
        transform: Callable[[dict[str, Any]], T],
        publish: Callable[[dict[str, T]], None],
        loop: asyncio.AbstractEventLoop,
        *,
        api_client: Any = None,
        forget_after_failures: int | None = None,
    ) -> None:
        """``list_call(api_client)``: the client's ``list_namespaced_*`` method to list and watch with.
        ``forget_after_failures``: publish an empty snapshot after this many failures in a row (facts
        that go stale mislead, e.g. reports); None keeps the last snapshot (e.g. backends)."""
        self.kind, self.list_call = kind, list_call
        self.namespace, self.selector = namespace, selector
        self.transform, self.publish, self.loop = transform, publish, loop
        self.api_client = api_client
        self.forget_after_failures = forget_after_failures
        self.synced = threading.Event()  # set after the first successful list
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind}-{namespace}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching: no publish after this; a watch blocked on the server ends at its next event or timeout."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def join(self, timeout_s: float) -> None:
        """Wait for the thread to end after ``stop`` (tests; a live watch ends at its next event)."""
        self._thread.join(timeout_s)

    def _send(self, items: dict[str, T]) -> None:
        if not self._stop.is_set():
            self.loop.call_soon_threadsafe(self.publish, dict(items))

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        from lorapool.kubeconfig import api_client as kube_api_client

        api_client = self.api_client or kube_api_client()
        list_fn = self.list_call(api_client)
        failures = 0
        while not self._stop.is_set():
            try:
                listed = list_fn(self.namespace, label_selector=self.selector)
                items = {
                    item.metadata.name: self.transform(api_client.sanitize_for_serialization(item))
                    for item in listed.items
                }
                self._send(items)
                self.synced.set()
                failures = 0
                self._watch = cast(Callable[[], watch.Watch], watch.Watch)()  # Watch.__init__ is unannotated
                for event in self._watch.stream(
                    list_fn,
                    self.namespace,
                    label_selector=self.selector,
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
                        items.pop(name, None)
                    else:
                        items[name] = self.transform(api_client.sanitize_for_serialization(obj))
                    self._send(items)
            except ApiException as exc:
                if exc.status != 410:
                    failures += 1
                    log.warning(f"Failed to watch {self.kind}", extra={"status": exc.status, "reason": exc.reason})
            except Exception as exc:  # network errors of any library layer: back off, re-list
                failures += 1
                log.warning(f"Failed to watch {self.kind}", extra={"error": repr(exc)})
            if failures:
                if self.forget_after_failures is not None and failures == self.forget_after_failures:
                    log.warning(f"Forgot {self.kind} until the watch recovers", extra={"failures": failures})
                    self._send({})
                self._stop.wait(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])
