"""Read the pool's adapter set through the API and watch it (shell). Two readers: the sidecar (what to
load; its config channel in a pod) and the router (which adapters the pool has, so one the set names
is held while it loads, never answered "not in the pool").

A ConfigMap volume reaches a container only when the kubelet refreshes it (about a minute on a
real node); a watch delivers a change in well under a second, and reading the objects directly
makes the sharded set's atomic read simple. ``SetWatcher`` GETs the index ``<pool>-adapters``
and each shard it names, checks every shard's hash against the index
(``lorapool.api.adapterset.assemble``) and publishes the whole set only when they agree: a
half-written update is never acted on, the last consistent set keeps serving, and it reads
again shortly. Then it watches the index (``fieldSelector=metadata.name=<index>``, which a
Role's ``resourceNames`` allow): the operator writes the shards before the index, so every
change ends with an index write. The watch's own timeout is the periodic re-read that catches
anything missed.

Credentials are the report's (``lorapool.podstatus.api_server``): the projected ServiceAccount
token in a pod, whose Role allows get/list/watch on these ConfigMaps by name and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from lorapool.api.adapterset import CONFIGMAP_KEY, InconsistentSet, assemble, read_index
from lorapool.podstatus import ApiServer

log = logging.getLogger("lorapool.adapterset")

ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class SetRef:
    """The index ConfigMap to read: ``NAMESPACE/NAME``."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> SetRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"--adapters-configmap {text!r}: expected NAMESPACE/NAME, e.g. default/llama3-8b-adapters")
        return cls(namespace, name)

    def path(self, name: str | None = None) -> str:
        return f"/api/v1/namespaces/{quote(self.namespace, safe='')}/configmaps/{quote(name or self.name, safe='')}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ReadError(Exception):
    """The API server refused or failed a read; the message says why (never a credential)."""


class SetWatcher:
    """Keeps ``snapshot``: the last consistent set's text (``adapters.json`` form), and ``error``: why
    the last read did not give one (None once it did). ``on_change`` runs when the snapshot changes."""

    def __init__(
        self,
        server: ApiServer,
        ref: SetRef,
        on_change: Callable[[], None],
        *,
        resync_s: float = 30.0,
        retry_s: float = 0.2,
        retry_cap_s: float = 5.0,
        timeout_s: float = 10.0,
    ) -> None:
        self.server, self.ref, self.on_change = server, ref, on_change
        self.resync_s, self.retry_s, self.retry_cap_s, self.timeout_s = resync_s, retry_s, retry_cap_s, timeout_s
        self.snapshot: bytes | None = None
        self.error: str | None = None
        self.reads = 0  # consistent reads (tests, /metrics)

    async def run(self, stop: asyncio.Event) -> None:
        """Read, watch until something changes (or ``resync_s`` passes), read again; back off on failure."""
        delay = self.retry_s
        connector = aiohttp.TCPConnector(ssl=self.server.ssl_context)
        async with aiohttp.ClientSession(connector=connector) as http:
            while not stop.is_set():
                version = await self.read_once(http)
                if version is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, self.retry_cap_s)
                    continue
                delay = self.retry_s
                await self._watch(http, version)

    async def read_once(self, http: aiohttp.ClientSession) -> str | None:
        """One consistent read: the index's resourceVersion to watch from, or None (``error`` says why)."""
        try:
            index_cm = await self._get(http, self.ref.name)
            if index_cm is None:
                raise ReadError(f"ConfigMap {self.ref} not found; the operator writes it when it renders the pool")
            data = index_cm.get("data") or {}
            index = read_index(data)
            shards = {}
            for shard in index.shards if index is not None else ():
                found = await self._get(http, shard.name)
                shards[shard.name] = None if found is None else (found.get("data") or {}).get(CONFIGMAP_KEY)
            text = assemble(index, data, shards)
        except InconsistentSet as exc:
            self._failed(f"adapter set {self.ref}: {exc}; keeping the last consistent set and reading again")
            return None
        except (ReadError, ValueError) as exc:
            self._failed(f"adapter set {self.ref}: {exc}")
            return None
        self.reads += 1
        if self.error is not None:
            log.info("Read adapter set again", extra={"kv": {"configmap": str(self.ref)}})
        self.error = None
        if text != self.snapshot:
            self.snapshot = text
            self.on_change()
        return str((index_cm.get("metadata") or {}).get("resourceVersion") or "")

    def _failed(self, message: str) -> None:
        if message != self.error:
            log.warning("Failed to read adapter set", extra={"kv": {"error": message}})
        self.error = message

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if token := self.server.token():
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _get(self, http: aiohttp.ClientSession, name: str) -> dict[str, Any] | None:
        """One ConfigMap, or None when it does not exist; ReadError for anything else that fails."""
        url = self.server.url + self.ref.path(name)
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with http.get(url, headers=self._headers(), timeout=timeout) as resp:
                if resp.status == 404:
                    return None
                if resp.status >= 400:
                    body = (await resp.text())[:ERROR_BODY_CHARS]
                    raise ReadError(f"GET ConfigMap {self.ref.namespace}/{name}: HTTP {resp.status}: {body}")
                found: dict[str, Any] = await resp.json(content_type=None)
                return found
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ReadError(f"GET ConfigMap {self.ref.namespace}/{name}: {type(exc).__name__}: {exc}") from exc

    async def _watch(self, http: aiohttp.ClientSession, version: str) -> None:
        """Returns at the index's first change after ``version``, when the watch ends (at most
        ``resync_s``: the periodic re-read), or when it fails (the read that follows says why)."""
        params = {
            "watch": "true",
            "fieldSelector": f"metadata.name={self.ref.name}",
            "timeoutSeconds": str(max(1, int(self.resync_s))),
            **({"resourceVersion": version} if version else {}),
        }
        url = self.server.url + self.ref.path().rsplit("/", 1)[0]
        timeout = aiohttp.ClientTimeout(total=self.resync_s + self.timeout_s, sock_connect=self.timeout_s)
        try:
            async with http.get(url, params=params, headers=self._headers(), timeout=timeout) as resp:
                if resp.status >= 400:
                    body = (await resp.text())[:ERROR_BODY_CHARS]
                    log.warning("Failed to watch adapter set", extra={"kv": {"status": resp.status, "error": body}})
                    await asyncio.sleep(self.retry_cap_s)  # a refused watch: poll at the retry cap, not in a loop
                    return
                async for line in resp.content:
                    if _is_event(line):
                        return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("Adapter set watch ended", extra={"kv": {"error": f"{type(exc).__name__}: {exc}"}})


def _is_event(line: bytes) -> bool:
    """A watch line that means: read again (any change, or an ERROR such as an expired resourceVersion)."""
    try:
        event = json.loads(line)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") in ("ADDED", "MODIFIED", "DELETED", "ERROR")
