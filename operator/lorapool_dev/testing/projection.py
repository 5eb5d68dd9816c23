"""A ConfigMap projected into a local directory as the kubelet projects a configMap volume.

The fake (KWOK) nodes of the local control plane run no kubelet, so the playground and the
tests run each engine pod's sidecar as a local process and feed it the pool's ConfigMap
through this: every key becomes ``<dir>/<key>`` -> ``..data/<key>``, and ``..data`` is swapped
atomically to a new timestamped directory on every change, exactly the layout the sidecar
reads in a pod (mounted without subPath). It polls every ``period_s`` (the kubelet takes up to
its sync period plus the ConfigMap cache TTL; one second keeps the playground snappy).

    with ConfigMapVolume(api, "ml", "llama3-8b-adapters", state / "cm").start() as volume:
        start_sidecar(config=volume.path("adapters.json"), ...)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lorapool_dev.testing.follow import Follower

log = logging.getLogger("lorapool_dev.testing")


class ConfigMapVolume(Follower):
    """Keeps ``root`` in line with ConfigMap ``namespace/name`` from a background thread."""

    def __init__(self, api_client: Any, namespace: str, name: str, root: Path, *, period_s: float = 1.0) -> None:
        super().__init__(f"configmap {namespace}/{name}", period_s)
        self.api_client = api_client
        self.namespace, self.name = namespace, name
        self.root = root
        self.updates = 0
        self._data: Mapping[str, str] | None = None
        root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / key

    def sync_once(self) -> bool:
        """Read the ConfigMap once; project it if it changed. True when the directory changed."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            cm = client.CoreV1Api(self.api_client).read_namespaced_config_map(self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False  # as the kubelet: the last projected content stays
            raise
        data = dict(cm.data or {})
        if data == self._data:
            return False
        self._write(data)
        self._data = data
        self.updates += 1
        return True

    def _write(self, data: Mapping[str, str]) -> None:
        version = self.root / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
        version.mkdir()
        for key, value in data.items():
            (version / key).write_text(value)
        tmp = self.root / "..data_tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(version.name)
        previous = (self.root / "..data").resolve() if (self.root / "..data").is_symlink() else None
        tmp.replace(self.root / "..data")
        for key in data:
            link = self.root / key
            if not link.is_symlink():
                link.symlink_to(f"..data/{key}")
        if previous is not None and previous != version and previous.parent == self.root:
            for child in previous.iterdir():
                child.unlink()
            previous.rmdir()
