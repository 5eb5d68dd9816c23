"""The router writes its request counts on its own Pod, through a real API server, as its rendered Role allows.

Real parts: the local control plane, a ``lorapool sim`` process, and ``lorapool router`` running
as the ServiceAccount bound to the Role the operator renders for it (so the test also proves
that Role suffices), driven by the official openai client. The router starts before its Pod
exists: its writes fail (logged), it serves regardless, and once the Pod exists the next
window lands on it as the annotation ``lorapool.io/requests``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from lorapool.api.requests import ANNOTATION, RequestWindow, pod_requests
from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.cluster.pytest_plugin import CLUSTER_START_S
from lorapool_dev.testing.accounts import bare_pool, create_accounts
from lorapool_dev.testing.components import start_router
from lorapool_dev.testing.wait import wait_until

from .conftest import StartSim

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(CLUSTER_START_S + 120)]

POOL = "counts"
ROUTER_POD = f"{POOL}-router-0"
WINDOW_S = 1.0


class PodWindows:
    """Every request window written on one Pod, from a watch of it started before the writes."""

    def __init__(self, api: Any, namespace: str, pod: str) -> None:
        from kubernetes import client as k8s
        from kubernetes import watch

        self.api, self.core = api, k8s.CoreV1Api(api)
        self.namespace, self.selector = namespace, f"metadata.name={pod}"
        self._watch = watch.Watch()
        self._seen: dict[float, RequestWindow] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._version = self.core.list_namespaced_pod(namespace, field_selector=self.selector).metadata.resource_version
        self._thread = threading.Thread(target=self._follow, name="pod windows", daemon=True)

    def __enter__(self) -> PodWindows:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(10)

    def _follow(self) -> None:
        from urllib3.exceptions import ProtocolError

        while not self._stop.is_set():  # each watch ends after 2 s: go on from the last version seen
            try:
                for event in self._watch.stream(
                    self.core.list_namespaced_pod, self.namespace, field_selector=self.selector,
                    resource_version=self._version, timeout_seconds=2,
                ):  # fmt: skip
                    pod = self.api.sanitize_for_serialization(event["object"])
                    self._version = pod["metadata"]["resourceVersion"]
                    if (w := pod_requests(pod)) is not None:
                        with self._lock:
                            self._seen[w.end] = w
            except (ProtocolError, OSError):  # a watch cut short: the next one resumes at the same version
                continue

    def read(self) -> dict[float, RequestWindow]:
        """The windows written so far, by when they closed."""
        with self._lock:
            return dict(self._seen)


@pytest.fixture
def router_account(local_cluster: LocalCluster) -> Iterator[tuple[str, Any, Path]]:
    """A namespace with the router's rendered ServiceAccount, Role and RoleBinding; yields
    (namespace, admin client, the router's kubeconfig)."""
    from kubernetes import client as k8s
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    ns = f"router-counts-{uuid.uuid4().hex[:6]}"
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    create_accounts(core, rbac, bare_pool(POOL, ns), ["router"])
    kubeconfig = local_cluster.service_account_kubeconfig(ns, names.router(POOL))
    yield ns, api, kubeconfig
    core.delete_namespace(ns)
    api.close()


def test_the_router_writes_each_closed_window_on_its_own_pod(
    router_account: tuple[str, Any, Path], start_sim: StartSim
) -> None:
    from kubernetes import client as k8s

    ns, api, kubeconfig = router_account
    core = k8s.CoreV1Api(api)
    sim = start_sim(time_scale=0)
    extra = ["--requests-window-s", f"{WINDOW_S:g}", "--pod", f"{ns}/{ROUTER_POD}", "--poll-interval", "0.2"]
    with start_router([sim], extra=extra, env={"KUBECONFIG": str(kubeconfig)}) as router:
        chat = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=30)

        # No Pod yet: the write fails and is logged; serving does not notice.
        wait_until(
            "the router to log its failed write",
            lambda: "Failed to publish request counts on Pod" in router.proc.output(),
            timeout_s=30,
            describe=router.proc.output,
        )
        assert chat.completions.create(model="code", prompt="hi", max_tokens=1).choices  # maybe never written

        # Each window replaces the last on the Pod, one a second: a read after the requests can find
        # theirs already replaced. A watch from before the Pod exists sees every write.
        with PodWindows(api, ns, ROUTER_POD) as written:
            core.create_namespaced_pod(
                ns,
                {
                    "metadata": {"name": ROUTER_POD, "labels": names.labels(POOL, "router")},
                    "spec": {"containers": [{"name": "router", "image": "lorapool"}]},
                },
            )
            for model in ("sql", "sql", "sql", "chat"):
                chat.completions.create(model=model, prompt="hi", max_tokens=1)
            sent = time.time()  # each request was counted as it arrived: in a window closing after now

            # The requests may straddle a window's end: sum the distinct windows written on the Pod.
            seen = wait_until(
                f"the Pod's {ANNOTATION} window closing after the requests",
                lambda: (w := written.read()) and max(w) >= sent and w,
                timeout_s=30,
                describe=lambda: (written.read(), router.proc.output()[-2000:]),
            )
        total: Counter[str] = Counter()
        for w in seen.values():
            total.update(w.counts)
        assert total["sql"] == 3 and total["chat"] == 1 and set(total) <= {"sql", "chat", "code"}, seen
        assert all(w.window_s == WINDOW_S for w in seen.values())
        # logged when the router reads the API server's answer, which may come after the watch saw the write
        wait_until(
            "the router to log its first write that landed",
            lambda: "Published request counts on Pod again" in router.proc.output(),
            timeout_s=10,
            describe=lambda: router.proc.output()[-2000:],
        )
