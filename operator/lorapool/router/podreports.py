"""Watches the pool's engine Pods and hands the router their sidecars' reports.

Shell: a ``kubewatch.ListWatch`` of Pods matching the engines' label selector in the pool's
namespace (``--report-pods NAMESPACE/SELECTOR``; the operator renders it). Each Pod becomes a
``lorapool.api.pods.EnginePod`` in the watch thread (the annotation is decoded there, once per change);
the router maps backends to pods and folds the reports in (``server``). When the watch keeps
failing (``FORGET_AFTER_FAILURES``), the reports are dropped until it recovers. RBAC needed:
get/list/watch on ``pods`` in the namespace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from lorapool.api.pods import EnginePod, engine_pod
from lorapool.router.kubewatch import ListWatch

# After this many failed lists/watches in a row (~3.5 s of backoff), the reports are dropped and
# /v1/models decides again: a stale "loading" would hold an adapter's requests, then 503 them,
# long after its engine loaded it.
FORGET_AFTER_FAILURES = 3


def parse_pods_target(target: str) -> tuple[str, str]:
    """``NAMESPACE/SELECTOR`` -> (namespace, label selector); ValueError says the expected form."""
    namespace, sep, selector = target.partition("/")
    if not sep or not namespace or not selector:
        raise ValueError(
            f"--report-pods={target!r} must be NAMESPACE/LABEL_SELECTOR,"
            " e.g. ml/lorapool.io/pool=mypool,app.kubernetes.io/component=engine"
        )
    return namespace, selector


def parse_backend_pod(value: str) -> tuple[str, str]:
    """``URL=POD`` -> (URL without a trailing slash, pod name); ValueError says the expected form."""
    url, sep, pod = value.rpartition("=")
    if not sep or not url.startswith(("http://", "https://")) or not pod:
        raise ValueError(f"--backend-pod={value!r} must be URL=POD, e.g. http://127.0.0.1:8001=mypool-engine-0")
    return url.rstrip("/"), pod


def _list_pods(api: Any) -> Callable[..., Any]:
    from kubernetes import client

    return client.CoreV1Api(api).list_namespaced_pod


def pod_report_watch(
    namespace: str,
    selector: str,
    publish: Callable[[dict[str, EnginePod]], None],
    loop: asyncio.AbstractEventLoop,
    *,
    api_client: Any = None,
) -> ListWatch[EnginePod]:
    """A watch of the engine Pods; ``publish`` gets ``{pod name: EnginePod}`` after every change."""
    return ListWatch(
        "Pods", _list_pods, namespace, selector, engine_pod, publish, loop,
        api_client=api_client, forget_after_failures=FORGET_AFTER_FAILURES,
    )  # fmt: skip
