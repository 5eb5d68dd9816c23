"""Run a pool's engine pods as local processes: what a kubelet would run on the fake GPU nodes.

KWOK's nodes run no containers, but the engine pods are real API objects. For each engine pod
of the pool (not terminating) this starts a `lorapool sim` with the pool's flags and an
adapter-sync sidecar that reads and watches the pool's adapter set through the API, and reports
on that very Pod, with the engine ServiceAccount's token, as in a cluster; a pod that goes away takes its processes with it. Used by
``lorapool dev`` and by the operator tests that need sidecars reporting.

    with LocalEngines(api, ns, "llama3-8b", state, sim_flags={...}, report_kubeconfig=sa).start() as engines:
        wait_until("2 replicas", lambda: len(engines.replicas) == 2, 30)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from lorapool.render.names import SLOT_ANNOTATION, SLOT_FILE
from lorapool_dev.testing.components import Component, start_sidecar, start_sim
from lorapool_dev.testing.follow import Follower

log = logging.getLogger("lorapool_dev.testing")

FAST_SIDECAR = (
    "--config-poll-seconds", "0.3", "--health-poll-seconds", "0.5", "--resync-seconds", "2",
    "--report-interval-seconds", "1",
)  # fmt: skip


@dataclass
class Replica:
    """One engine pod's local processes."""

    pod: str
    sim: Component
    sidecar: Component

    def close(self) -> None:
        self.sidecar.close()
        self.sim.close()


class LocalEngines(Follower):
    """Keeps one sim + reporting sidecar per live engine pod of ``pool``, from a background thread."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        pool: str,
        state_dir: Path,
        *,
        sim_flags: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        report_kubeconfig: Path,
        sidecar_extra: Sequence[str] = FAST_SIDECAR,
        period_s: float = 1.0,
        on_change: Callable[[list[str]], None] | None = None,
        start_engine: Callable[..., Component] | None = None,
    ) -> None:
        """``sim_flags``: `start_sim` flags, or a function giving them when a pod starts (the pool's
        current plan: pods that roll for new flags get engines with them). ``on_change``: called with
        the backend URLs whenever the set of engines changed (from the following thread)."""
        from lorapool.render import names

        super().__init__(f"engine pods of {namespace}/{pool}", period_s)
        self.api_client = api_client
        self.namespace, self.pool = namespace, pool
        self.state_dir = state_dir
        self.sim_flags = sim_flags
        self.on_change = on_change
        self.start_engine = start_engine or start_sim  # lorapool_dev.engine.playground: real vLLM instead
        self.report_kubeconfig = report_kubeconfig
        self.sidecar_extra = tuple(sidecar_extra)
        self.selector = names.selector_string(pool, "engine")
        self.adapter_set = names.adapters_configmap(pool)
        self.replicas: dict[str, Replica] = {}
        self._lock = threading.Lock()

    @property
    def backends(self) -> list[str]:
        with self._lock:
            return [r.sim.url for r in self.replicas.values()]

    def live_pods(self) -> list[str]:
        from kubernetes import client

        pods = client.CoreV1Api(self.api_client).list_namespaced_pod(self.namespace, label_selector=self.selector)
        live: list[str] = []
        for pod in pods.items:
            meta = pod.metadata  # a listed Pod always has metadata and a name; the client types both optional
            if meta is None or meta.name is None or meta.deletion_timestamp is not None:
                continue
            live.append(meta.name)
            # the downward-API volume: the pod's placement slot (docs/placement.md)
            self._project_slot(meta.name, (meta.annotations or {}).get(SLOT_ANNOTATION, ""))
        return sorted(live)

    def slot_file(self, pod: str) -> Path:
        return self.state_dir / "podinfo" / pod / SLOT_FILE

    def _project_slot(self, pod: str, value: str) -> None:
        path = self.slot_file(pod)
        if path.exists() and path.read_text() == value:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(value)
        tmp.replace(path)

    def sync_once(self) -> None:
        live = set(self.live_pods())
        with self._lock:
            gone = [self.replicas.pop(n) for n in list(self.replicas) if n not in live]
        for replica in gone:
            log.info("Stopped local engine of deleted Pod %s", replica.pod)
            replica.close()
        new = sorted(live - set(self.replicas))
        for pod in new:
            if self.stopping:
                return
            replica = self._start(pod)
            with self._lock:
                self.replicas[pod] = replica
        if (gone or new) and self.on_change is not None:
            self.on_change(self.backends)

    def _start(self, pod: str) -> Replica:
        flags = self.sim_flags() if callable(self.sim_flags) else self.sim_flags
        sim = self.start_engine(**flags, timeout_s=60)
        try:
            # As in a real pod: the adapter set read and watched through the API (index and shards),
            # with the engine ServiceAccount's Role, which names those ConfigMaps and nothing else.
            sidecar = start_sidecar(
                config=None,
                engine_url=sim.url,
                adapter_dir=self.state_dir / "adapters" / pod,
                extra=[
                    "--adapters-configmap", f"{self.namespace}/{self.adapter_set}",
                    "--pod", f"{self.namespace}/{pod}", "--report-kubeconfig", str(self.report_kubeconfig),
                    "--slot-file", str(self.slot_file(pod)), *self.sidecar_extra,
                ],
            )  # fmt: skip
        except BaseException:
            sim.close()
            raise
        log.info("Started local engine for Pod %s: sim %s", pod, sim.url)
        return Replica(pod, sim, sidecar)

    join_timeout_s = 60.0  # a replica starting when stop comes: its sim and sidecar must come up first

    def start(self) -> Self:
        """Start a replica per engine pod now, then follow the pods."""
        try:
            return super().start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        super().stop()
        with self._lock:
            replicas, self.replicas = list(self.replicas.values()), {}
        for replica in replicas:
            replica.close()
