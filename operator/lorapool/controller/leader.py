"""Leader election on a coordination.k8s.io Lease, so two operator replicas are safe.

kopf's peering pauses equal-priority peers instead of electing one; a Lease is what
controller-runtime uses and what platform engineers expect. The standby replica waits
to acquire the Lease before its kopf loop starts; a leader that cannot renew before the
Lease expires stops itself, so two replicas never reconcile at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("lorapool.operator")


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(ts: Any) -> datetime | None:
    if ts is None:
        return None
    if isinstance(ts, datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(ts).replace("Z", "+00:00"))


class LeaseElector:
    """Acquire and keep one Lease; ``identity`` is this replica (pod name)."""

    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, identity: str, lease_s: int = 15, renew_s: float = 5.0
    ) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_s = lease_s, renew_s

    def try_acquire(self) -> bool:
        """One attempt to become or stay leader; optimistic concurrency via resourceVersion."""
        now = _now()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_s, "renewTime": _micro(now)}
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0},
            }
            try:
                # The client sends a dict body unchanged (sanitize_for_serialization) though it annotates
                # only V1Lease; a dict keeps renewTime/acquireTime in the MicroTime form _micro writes.
                self.coord.create_namespaced_lease(self.namespace, cast(client.V1Lease, body))
                return True
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
        held = self._spec(lease)
        holder = held.holder_identity
        renewed = _parse(held.renew_time) or datetime.min.replace(tzinfo=UTC)
        duration = timedelta(seconds=held.lease_duration_seconds or self.lease_s)
        if holder not in (None, "", self.identity) and renewed + duration > now:
            return False
        held.renew_time = now
        held.lease_duration_seconds = self.lease_s
        if holder != self.identity:
            held.holder_identity = self.identity
            held.acquire_time = now
            held.lease_transitions = (held.lease_transitions or 0) + 1
        try:
            self.coord.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first
                return False
            raise
        return True

    async def acquire(self) -> None:
        """Block until this replica leads."""
        announced = False
        while not await asyncio.to_thread(self._safe_try):
            if not announced:
                log.info("Waiting for leader Lease %s/%s", self.namespace, self.name)
                announced = True
            await asyncio.sleep(self.renew_s / 2)
        log.info("Acquired leader Lease %s/%s as %s", self.namespace, self.name, self.identity)

    async def keep(self, lost: asyncio.Event) -> None:
        """Renew until a renewal fails for longer than the Lease lasts; then set ``lost``."""
        last_ok = _now()
        while not lost.is_set():
            await asyncio.sleep(self.renew_s)
            if await asyncio.to_thread(self._safe_try):
                last_ok = _now()
            elif _now() - last_ok > timedelta(seconds=self.lease_s - self.renew_s):
                log.error("Lost leader Lease %s/%s; stopping", self.namespace, self.name)
                lost.set()

    def release(self) -> None:
        """Hand the Lease over at shutdown so a standby takes over at once."""
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
            held = self._spec(lease)
            if held.holder_identity == self.identity:
                held.holder_identity = ""
                held.renew_time = None
                self.coord.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException:
            pass

    def _spec(self, lease: client.V1Lease) -> client.V1LeaseSpec:
        """The Lease's spec; every Lease this elector writes has one, so a missing one is an error."""
        if lease.spec is None:
            raise ValueError(f"Lease {self.namespace}/{self.name} has no spec; delete it so the operator recreates it")
        return lease.spec

    def _safe_try(self) -> bool:
        try:
            return self.try_acquire()
        except Exception as exc:  # API unreachable: not leader this round
            log.warning("Failed to renew leader Lease: %s", exc)
            return False
