"""Engine and router Pods as lorapool reads them, each parsed once. Pure data.

``engine_pods`` turns the Pods the API server lists (camelCase dicts) into ``EnginePod`` values:
name, readiness, whether it is terminating, its placement slot, the conditions and its
sidecar's report (``lorapool.api.report``), decoded here and nowhere else. The operator builds
them once per list in a reconcile and hands them to ``controller.decide``, ``.holders`` and
``.tuning``; ``controller.triggers`` reads one per watch event; the router keeps one per pod
from its watch (``router.core.reports``). "Is this pod serving" has its one home here
(``EnginePod.serving``). ``router_pods`` does the same for the router Pods whose request
counts (``lorapool.api.requests``) placement sizes k from, and whose policy state
(``lorapool.api.routerpolicy``: the document it runs, the edit it refused) the pool's
``RouterPolicyAccepted`` condition reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lorapool.api.books import ANNOTATION as BOOKS_ANNOTATION
from lorapool.api.books import BooksState
from lorapool.api.books import decode_state as decode_books
from lorapool.api.report import ANNOTATION, ReplicaReport, pod_report
from lorapool.api.requests import RequestWindow, pod_requests
from lorapool.api.routerpolicy import PolicyState, pod_policy_state

# The engine pod's annotations the operator writes (re-exported by ``lorapool.render.names``):
# its stable placement slot, and the deletion cost that makes a scale-down remove the top slot.
SLOT_ANNOTATION = "lorapool.io/slot"
POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


@dataclass(frozen=True)
class PodCondition:
    """One of ``status.conditions``, its fields as strings (None when absent)."""

    type: str | None
    status: str | None
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class EnginePod:
    """What lorapool reads of one engine Pod."""

    name: str
    ip: str | None = None  # status.podIP
    ready: bool = False  # condition Ready=True
    terminating: bool = False  # metadata.deletionTimestamp set
    report: ReplicaReport | None = None  # its sidecar's report; None when absent or unreadable
    slot: int | None = None  # the slot annotation, None when absent or unreadable
    created: str = ""  # metadata.creationTimestamp
    deletion_cost: str | None = None  # the pod-deletion-cost annotation as written
    resource_version: str | None = None  # metadata.resourceVersion: the same one is the same Pod
    phase: str | None = None  # status.phase
    labels: tuple[tuple[str, str], ...] = ()  # sorted
    annotations: tuple[tuple[str, str], ...] = ()  # sorted, the report's own annotation left out
    conditions: tuple[PodCondition, ...] = ()
    report_unreadable: bool = False  # the report annotation is there but does not decode

    @property
    def serving(self) -> bool:
        """A pod the Service routes to: Ready and not terminating."""
        return self.ready and not self.terminating

    @property
    def usable(self) -> ReplicaReport | None:
        """The report, when it may be trusted for routing: the pod is serving."""
        return self.report if self.serving else None

    @property
    def unschedulable(self) -> str | None:
        """The scheduler's message when it cannot place the pod (PodScheduled=False, Unschedulable)."""
        for c in self.conditions:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return c.message or ""
        return None


def terminating(pod: Mapping[str, Any]) -> bool:
    """True when a Pod (any Pod, as the API server returns it) is being deleted."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def engine_pod(pod: Mapping[str, Any]) -> EnginePod:
    """Read one Pod as the API server returns it (camelCase dict); decodes its report once."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    conditions = tuple(
        PodCondition(_text(c.get("type")), _text(c.get("status")), _text(c.get("reason")), _text(c.get("message")))
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping)
    )
    report = pod_report(pod)
    slot = str(annotations.get(SLOT_ANNOTATION, ""))
    return EnginePod(
        name=str(meta.get("name") or ""),
        ip=status.get("podIP") or None,
        ready=any(c.type == "Ready" and c.status == "True" for c in conditions),
        terminating=terminating(pod),
        report=report,
        slot=int(slot) if slot.isascii() and slot.isdigit() else None,  # isdigit alone lets '²' through
        created=str(meta.get("creationTimestamp", "")),
        deletion_cost=annotations.get(POD_DELETION_COST_ANNOTATION),
        resource_version=_text(meta.get("resourceVersion")),
        phase=_text(status.get("phase")),
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        annotations=tuple(sorted((k, v) for k, v in annotations.items() if k != ANNOTATION)),
        conditions=conditions,
        report_unreadable=report is None and bool(annotations.get(ANNOTATION)),
    )


def engine_pods(items: Iterable[Mapping[str, Any]], known: Iterable[EnginePod] = ()) -> tuple[EnginePod, ...]:
    """The listed Pods as ``EnginePod`` values, in list order.

    ``known``: pods read earlier (an earlier list in the same reconcile); a Pod whose name and
    resourceVersion match one of them is that one, not decoded again.
    """
    earlier: dict[tuple[str, str | None], EnginePod] = {
        (p.name, p.resource_version): p for p in known if p.resource_version
    }
    out: list[EnginePod] = []
    for item in items:
        meta = item.get("metadata") or {}
        same = earlier.get((str(meta.get("name") or ""), _text(meta.get("resourceVersion"))))
        out.append(same if same is not None else engine_pod(item))
    return tuple(out)


@dataclass(frozen=True)
class RouterPod:
    """What the operator reads of one router Pod: its last closed window of request counts
    (``lorapool.api.requests``) and its policy state (``lorapool.api.routerpolicy``), decoded here
    once per list, and whether it is being deleted."""

    name: str
    terminating: bool = False
    requests: RequestWindow | None = None  # None: none written yet (an old router) or unreadable
    policy: PolicyState | None = None  # None: none written yet (starting, an old router) or unreadable
    books: BooksState | None = None  # its shared-books state (api.books); None: none written or unreadable


def router_pod(pod: Mapping[str, Any]) -> RouterPod:
    """Read one router Pod as the API server returns it (camelCase dict)."""
    meta = pod.get("metadata") or {}
    return RouterPod(
        name=str(meta.get("name") or ""),
        terminating=terminating(pod),
        requests=pod_requests(pod),
        policy=pod_policy_state(pod),
        books=decode_books((meta.get("annotations") or {}).get(BOOKS_ANNOTATION)),
    )


def router_pods(items: Iterable[Mapping[str, Any]]) -> tuple[RouterPod, ...]:
    """The listed router Pods as ``RouterPod`` values, in list order."""
    return tuple(router_pod(item) for item in items)
