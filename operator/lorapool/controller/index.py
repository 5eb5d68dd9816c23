"""LoRAAdapters by pool, in memory: what a reconcile reads instead of listing the namespace. Pure.

An informer's cache and field index, the controller-runtime way: ``controller.app`` feeds every
LoRAAdapter watch event in (``observe``), keyed by namespace and ``spec.poolRef.name``; a reconcile
reads its pool's adapters from here (``of_pool``). A namespace is listed once per operator process
(``prime``, from the API server's watch cache: ``resourceVersion=0``), because the watch may not have
delivered every existing object when the first pool of that namespace reconciles; whatever the watch
said of an object before that list is newer than the list and wins.

Each object is kept without ``metadata.managedFields`` (often the larger part of it). Its status is
what the watch last saw, or what the operator last wrote (``record_status``): the operator skips a
status write that would not change it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from lorapool.api import mergepatch

Key = tuple[str, str]  # (namespace, name)


def pool_of(body: Mapping[str, Any]) -> str | None:
    """The pool a LoRAAdapter's spec.poolRef names, if any."""
    ref = (body.get("spec") or {}).get("poolRef") or {}
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def _slim(body: Mapping[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(dict(body))
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class AdapterIndex:
    """LoRAAdapter objects by (namespace, pool); one per operator process, used from the event loop only."""

    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, Any]] = {}
        self._by_pool: dict[Key, set[str]] = {}  # (namespace, pool) -> adapter names
        self._primed: set[str] = set()  # namespaces listed once
        self._evented: dict[str, set[str]] = {}  # namespace not primed yet -> names the watch already told of
        self.lists = 0  # namespace lists made (prime): 1 per namespace per process

    def primed(self, namespace: str) -> bool:
        return namespace in self._primed

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event (None/ADDED/MODIFIED/DELETED) on a LoRAAdapter."""
        meta = body.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return
        if namespace not in self._primed:
            self._evented.setdefault(namespace, set()).add(name)
        self._drop((namespace, name))
        if event_type != "DELETED":
            self._put(_slim(body))

    def prime(self, namespace: str, bodies: list[dict[str, Any]]) -> None:
        """The namespace's one list: objects the watch has not told of yet; the watch keeps it after."""
        told = self._evented.pop(namespace, set())
        for body in bodies:
            if (body.get("metadata") or {}).get("name") not in told:
                self._put(_slim(body))
        self._primed.add(namespace)
        self.lists += 1

    def of_pool(self, namespace: str, pool: str) -> list[dict[str, Any]]:
        """The LoRAAdapters whose spec.poolRef names ``pool``, by name (the objects themselves: do not mutate)."""
        names = sorted(self._by_pool.get((namespace, pool), ()))
        return [self._objects[(namespace, n)] for n in names]

    def record_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """What the operator just wrote (merged like the merge patch it sent), until the watch's echo."""
        obj = self._objects.get((namespace, name))
        if obj is not None:
            obj["status"] = mergepatch.apply(obj.get("status") or {}, status)

    def __len__(self) -> int:
        return len(self._objects)

    def _put(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        self._drop(key)
        self._objects[key] = body
        pool = pool_of(body)
        if pool is not None:
            self._by_pool.setdefault((key[0], pool), set()).add(key[1])

    def _drop(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        pool = pool_of(old) if old is not None else None
        if pool is not None:
            names = self._by_pool.get((key[0], pool))
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._by_pool[(key[0], pool)]
