"""Which watch events ask for a reconcile: what of an object the reconcile reads. Pure.

The reconcile is level-based and reads everything anew, so an event only needs to say "look
again" when something it reads changed. Two kinds of events do not:

- a change of a LoRAPool's or LoRAAdapter's **status** alone: the echo of the reconcile's own
  write (``object_mark`` leaves status out);
- a sidecar report that changes nothing the operator computes from it: an adapter moving from
  Downloading to Verifying to Loading (all "in progress"), the ``adapters-synced`` condition's
  counting message, or the engine observations that the sizing loop reads (they change once
  per window on every replica; the next reconcile, at the latest the drift resync, reads them).

``pod_mark`` keeps what ``decide.presence``, ``decide.unschedulable``, placement (the slot
annotation) and readiness read. ``controller.app`` compares marks per object and triggers only
when one changed (engine pods, on top, at most once per pool per window).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lorapool.api.pods import EnginePod
from lorapool.api.report import IN_PROGRESS, SYNCED_CONDITION, ReplicaPhase

Mark = tuple[Any, ...]


def object_mark(meta: Mapping[str, Any] | None) -> Mark:
    """What of a LoRAPool's or LoRAAdapter's metadata asks for a reconcile: generation (the spec),
    labels, annotations, deletion; never its status, which the reconcile itself writes."""
    meta = meta or {}
    return (
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        tuple(sorted((meta.get("labels") or {}).items())),
        tuple(sorted((meta.get("annotations") or {}).items())),
    )


def _adapter_state(phase: ReplicaPhase, loaded: str | None, id_: str | None, message: str | None) -> Mark:
    """An adapter on one replica as the operator counts it: held at which identity, failed why, or in progress."""
    if phase == ReplicaPhase.FAILED:
        return ("failed", id_, loaded, message)
    return ("in-progress" if phase in IN_PROGRESS else str(phase), id_, loaded)


def pod_mark(pod: EnginePod) -> Mark:
    """What of an engine Pod the reconcile reads: deletion, labels and annotations (the slot), phase,
    conditions (the synced condition without its counting message) and the report's holdings."""
    conditions = tuple(
        sorted(
            (
                str(c.type),
                str(c.status),
                str(c.reason),
                "" if c.type == SYNCED_CONDITION else str(c.message or ""),
            )
            for c in pod.conditions
        )
    )
    report = pod.report
    holdings: Mark = ()
    if report is not None:
        holdings = (
            report.engine_healthy,
            tuple(
                (name, _adapter_state(a.phase, a.loaded, a.id, a.message))
                for name, a in sorted(report.adapters.items())
            ),
        )
    elif pod.report_unreadable:
        holdings = ("unreadable",)
    return (pod.terminating, pod.labels, pod.annotations, pod.phase, conditions, holdings)
