"""Admission: bind a request now, hold it, or refuse it, and say why. Pure.

Every routing decision of the router, over plain data: the named policy (``Scheduling``), every
backend's ``Backend`` view (the sidecar's report included) and the backends a request already
tried. Each function returns a result that carries all the shell needs, so no shell runs a
filter or maps a standing again:

- ``admit``: a request arrives or is retried elsewhere -> ``Bind | Hold | Refuse | Refresh``;
- ``bind_held``: something may have freed room for a held request -> ``Bind`` or None;
- ``expire``: a held request waited its limit -> ``Bind`` (best effort) or ``Refuse``;
- ``lost_load``: the reports changed under requests held for a load -> ``Refuse`` or None;
- ``moved_to``: a gateway sent a request to one of its fallbacks -> that backend's ``Bind``;
- ``runnable``: which held requests are worth trying at all (1000s of queues).

The router's scheduler (``router.scheduler``) carries the results out: it counts a bind, parks a
hold in its adapter's queue and times it out, raises a refusal, re-reads /v1/models on a
``Refresh``. Any front door (the HTTP proxy, a gateway's endpoint picker) goes through that
scheduler, so a decision never differs between doors. A refusal knows its HTTP answer
(``status``, ``error_type``, ``message``, ``param``, whether it carries ``Retry-After``).

Which filter refused is read from the strict policy's own chain (``Policy.filter``): every named
policy starts with ``healthy`` > ``serves-model`` (a test holds the registry to it), so nothing up
is a 503 and a model no live backend serves is decided by the reports' standing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from lorapool.router.core.backend import Backend, DecisionKind, Request, classify
from lorapool.router.core.filters.healthy import PLUGIN as HEALTHY
from lorapool.router.core.filters.saturation import PLUGIN as SATURATION
from lorapool.router.core.filters.serves_model import PLUGIN as SERVES_MODEL
from lorapool.router.core.policy import Policy, Scheduling
from lorapool.router.core.reports import Standing, Verdict, standing


class HoldReason(StrEnum):
    """Why a request waits in the router (the queue-wait metrics' ``reason`` label)."""

    SLOT = "slot"  # no replica has a LoRA slot for it: grouping (waits, then best effort)
    LOAD = "load"  # its adapter is loaded nowhere yet, loading somewhere (waits, then 503)
    SATURATED = "saturated"  # every replica is at its --max-inflight or --max-prefilling (waits, then best effort)
    # --fair-dispatch: its adapter is more than the bound ahead of one waiting for a LoRA slot, so
    # it waits while its slots drain (the scheduler decides it; waits --max-wait, then best effort)
    FAIR = "fair"


class RefusalReason(StrEnum):
    """Why a request is refused; each reason has one HTTP answer (``ANSWERS``)."""

    NO_BACKEND_UP = "no-backend-up"  # `healthy` left none (or, best effort, nothing could take it)
    EVERY_BACKEND_TRIED = "every-backend-tried"  # `healthy` left none of the backends not tried yet
    LOADED_ONLY_ON_DOWN = "loaded-only-on-down"  # `serves-model` left none; reports: loaded on others
    POLICY_NEVER_HOLDS = "policy-never-holds"  # the policy's filters left none and it has no hold rule
    STILL_LOADING = "still-loading"  # held for a load that had not finished when the wait ran out
    LOAD_FAILED = "load-failed"  # reports: failed on every replica that knows it
    NOT_IN_POOL = "not-in-pool"  # reports: unknown to every report (or being unloaded)
    NO_SUCH_MODEL = "no-such-model"  # `serves-model` left none and no report exists: vLLM's 404
    QUEUE_FULL = "queue-full"  # the wait queues hold --max-queued requests already
    SHED = "shed"  # a sheddable adapter's held request, dropped for a more important one (queues full)


class Answer(NamedTuple):
    """A refusal's HTTP answer: status, OpenAI error type, message template, the ``param`` named."""

    status: int
    error_type: str
    template: str  # str.format with ``model`` and ``detail``
    param: str | None = None


_UNAVAILABLE = "no backend can serve {model!r} now ({detail}); retry later"
ANSWERS: Mapping[RefusalReason, Answer] = {
    RefusalReason.NO_BACKEND_UP: Answer(503, "ServiceUnavailable", _UNAVAILABLE),
    RefusalReason.EVERY_BACKEND_TRIED: Answer(503, "ServiceUnavailable", _UNAVAILABLE),
    RefusalReason.LOADED_ONLY_ON_DOWN: Answer(503, "ServiceUnavailable", _UNAVAILABLE),
    RefusalReason.POLICY_NEVER_HOLDS: Answer(503, "ServiceUnavailable", _UNAVAILABLE),
    RefusalReason.STILL_LOADING: Answer(503, "ServiceUnavailable", "{detail}; retry later"),
    # The sidecars' reason when their reports know why; else vLLM's own words.
    RefusalReason.LOAD_FAILED: Answer(404, "NotFoundError", "{detail}", "model"),
    RefusalReason.NOT_IN_POOL: Answer(404, "NotFoundError", "{detail}", "model"),
    RefusalReason.NO_SUCH_MODEL: Answer(404, "NotFoundError", "The model `{model}` does not exist.", "model"),
    RefusalReason.QUEUE_FULL: Answer(429, "RateLimitError", "the router is saturated ({detail}); retry later"),
    RefusalReason.SHED: Answer(
        503, "ServiceUnavailable", "the pool is saturated and {model!r} is sheddable ({detail}); retry later"
    ),
}


@dataclass(frozen=True, slots=True)
class Bind:
    """Send the request to ``backend`` now."""

    backend: str
    kind: DecisionKind  # hit / free_slot / miss, against the backend's LoRA slots before this request
    # The adapter is in flight there or among the last max-loras to run (a GPU slot, no load);
    # True for a base-model request, which needs no slot.
    in_slot: bool
    loaded_late: bool = False  # it waited for a sidecar to load its adapter
    best_effort: bool = False  # chosen by the fallback policy: over the slot limit, or after its wait

    @property
    def hit(self) -> bool:
        """The adapter was already in a GPU slot there and did not wait for a load."""
        return self.in_slot and not self.loaded_late


@dataclass(frozen=True, slots=True)
class Hold:
    """Park the request in its adapter's queue; an event may bind it (``bind_held``), else ``expire``."""

    reason: HoldReason
    refused_by: str  # the strict policy's filter that left no backend (e.g. lora-slots, serves-model)
    detail: str = ""  # for a load: the reports' word ("adapter 'x' is loading on 1 replica(s)")


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the request at once, with why: the reason, the filter or standing behind it, the detail."""

    reason: RefusalReason
    model: str
    detail: str = ""  # what makes the message specific (the sidecars' reason, the replicas, the wait)
    refused_by: str = ""  # the filter that left no backend, when one did
    standing: Standing | None = None  # the reports' standing the answer rests on, when it does

    @property
    def status(self) -> int:
        return ANSWERS[self.reason].status

    @property
    def error_type(self) -> str:
        return ANSWERS[self.reason].error_type

    @property
    def param(self) -> str | None:
        return ANSWERS[self.reason].param

    @property
    def retry(self) -> bool:
        """503 and 429 ask the client to come back (``Retry-After``); a 404 does not."""
        return self.status != 404

    @property
    def message(self) -> str:
        return ANSWERS[self.reason].template.format(model=self.model, detail=self.detail)


@dataclass(frozen=True, slots=True)
class Refresh:
    """No live backend lists the model, and these have no report: their /v1/models may be stale.
    Re-read the lists, then ``admit`` again with ``lists_fresh=True``."""

    unreported: tuple[str, ...]


Admission = Bind | Hold | Refuse | Refresh


def admit(
    scheduling: Scheduling,
    req: Request,
    backends: Sequence[Backend],
    tried: Set[str] = frozenset(),
    *,
    lists_fresh: bool = True,
) -> Admission:
    """Where ``req`` goes now. ``backends``: every backend (down and tried ones too: their reports
    count); ``tried``: the ids it was sent to already; ``lists_fresh``: False when the caller can
    re-read /v1/models (then a model nobody lists may get ``Refresh`` first)."""
    candidates = _untried(backends, tried)
    survivors, refused_by = scheduling.strict.filter(req, candidates)
    chosen = scheduling.strict.pick(req, survivors)
    if chosen is not None:  # the common case: the policy's own filters said all there is to say
        return _bind(req, candidates, chosen)
    if refused_by == HEALTHY.name:
        if tried:
            return Refuse(RefusalReason.EVERY_BACKEND_TRIED, req.model, "every backend was tried", refused_by)
        return Refuse(RefusalReason.NO_BACKEND_UP, req.model, "no backend is up", refused_by)
    if refused_by == SERVES_MODEL.name:
        unreported = tuple(b.id for b in candidates if b.up and b.report is None)
        if not lists_fresh and unreported:
            return Refresh(unreported)
        return _not_served(req, backends)
    if scheduling.hold is None:
        return Refuse(RefusalReason.POLICY_NEVER_HOLDS, req.model, "no backend may take the request", refused_by)
    if refused_by == SATURATION.name:  # room for its adapter, but every replica is full: whatever the hold rule
        return Hold(HoldReason.SATURATED, refused_by)
    if not scheduling.hold(req, candidates):
        return _best_effort(scheduling.fallback, req, candidates, loaded_late=False)
    return Hold(HoldReason.SLOT, refused_by)


def bind_held(
    scheduling: Scheduling, req: Request, backends: Sequence[Backend], tried: Set[str], reason: HoldReason
) -> Bind | None:
    """The strict policy's bind for a held request, or None while it still fits nowhere."""
    candidates = _untried(backends, tried)
    chosen = scheduling.strict.choose(req, candidates)
    return _bind(req, candidates, chosen, loaded_late=reason == HoldReason.LOAD) if chosen is not None else None


def expire(
    scheduling: Scheduling,
    req: Request,
    reason: HoldReason,
    backends: Sequence[Backend],
    tried: Set[str],
    max_wait_s: float,
) -> Bind | Refuse:
    """A held request waited ``max_wait_s``: best effort by the fallback policy, unless it waited for
    a load that no live backend serves yet (then the reports' standing answers)."""
    candidates = _untried(backends, tried)
    loaded_late = reason == HoldReason.LOAD
    survivors, refused_by = scheduling.fallback.filter(req, candidates)
    if loaded_late and refused_by in (HEALTHY.name, SERVES_MODEL.name):
        verdict = _standing(req, backends)
        if (refusal := _lost(req.model, verdict, refused_by)) is not None:
            return refusal
        if verdict.standing == Standing.LOADED:
            why = f"adapter {req.model!r} is loaded only on replicas that are down or were tried"
            return Refuse(RefusalReason.LOADED_ONLY_ON_DOWN, req.model, why, refused_by, verdict.standing)
        why = verdict.reason or f"adapter {req.model!r} is not loaded on any replica yet"
        detail = f"{why}; waited {max_wait_s:g} s (--max-wait)"
        return Refuse(RefusalReason.STILL_LOADING, req.model, detail, refused_by, verdict.standing)
    return _pick_best_effort(scheduling.fallback, req, candidates, survivors, refused_by, loaded_late=loaded_late)


def lost_load(model: str, backends: Sequence[Backend], in_pool: bool | None = None) -> Refuse | None:
    """For requests held for ``model``'s load: the 404 when the reports (and the adapter set, when
    ``in_pool`` says) now say it failed or is gone."""
    return _lost(model, standing(model, {b.id: b.report for b in backends}, in_pool), SERVES_MODEL.name)


def moved_to(req: Request, backends: Sequence[Backend], backend: str) -> Bind:
    """The bind of a request that a gateway sent to ``backend`` rather than where it was bound
    (a fallback after the first failed): best effort, classified against that backend."""
    return _bind(req, backends, backend, best_effort=True)


def runnable(backends: Sequence[Backend], base_models: Set[str]) -> frozenset[str] | None:
    """Which held models may bind now, before the policy runs for each: None (any) while a live
    backend below its cap has a free slot; else those in flight on a live backend below its cap
    and the base models; none when no backend is up or every live one is saturated."""
    live = [b for b in backends if b.up and not b.saturated()]
    if not live:
        return frozenset()
    if any(len(b.active) < b.max_loras for b in live):
        return None
    return frozenset().union(*(b.active.keys() for b in live)) | base_models


def _untried(backends: Sequence[Backend], tried: Set[str]) -> Sequence[Backend]:
    return [b for b in backends if b.id not in tried] if tried else backends


def _standing(req: Request, backends: Sequence[Backend]) -> Verdict:
    """The adapter's standing over every backend's report (a base model has none to stand on)."""
    if not req.is_adapter:
        return Verdict(Standing.UNREPORTED)
    return standing(req.model, {b.id: b.report for b in backends}, req.in_pool)


def _lost(model: str, verdict: Verdict, refused_by: str) -> Refuse | None:
    """The 404 of a standing that says the adapter will not load here: failed, or not in the pool."""
    if verdict.standing == Standing.FAILED:
        return Refuse(RefusalReason.LOAD_FAILED, model, verdict.reason, refused_by, verdict.standing)
    if verdict.standing == Standing.UNKNOWN:
        return Refuse(RefusalReason.NOT_IN_POOL, model, verdict.reason, refused_by, verdict.standing)
    return None


def _not_served(req: Request, backends: Sequence[Backend]) -> Hold | Refuse:
    """No live backend serves the model: hold for a load the reports announce, else say why not.

    The reports of every backend count (down or already tried ones too): an adapter held only by
    replicas that are down is a 503, not a 404 "not in the pool"."""
    verdict = _standing(req, backends)
    if verdict.standing == Standing.LOADED:
        held_by = ", ".join(verdict.loaded_on)
        why = f"adapter {req.model!r} is loaded only on replicas that are down or were tried ({held_by})"
        return Refuse(RefusalReason.LOADED_ONLY_ON_DOWN, req.model, why, SERVES_MODEL.name, verdict.standing)
    if verdict.standing == Standing.LOADING:
        return Hold(HoldReason.LOAD, SERVES_MODEL.name, verdict.reason)
    if (refusal := _lost(req.model, verdict, SERVES_MODEL.name)) is not None:
        return refusal
    return Refuse(RefusalReason.NO_SUCH_MODEL, req.model, "", SERVES_MODEL.name, verdict.standing)


def _best_effort(policy: Policy, req: Request, candidates: Sequence[Backend], *, loaded_late: bool) -> Bind | Refuse:
    survivors, refused_by = policy.filter(req, candidates)
    return _pick_best_effort(policy, req, candidates, survivors, refused_by, loaded_late=loaded_late)


def _pick_best_effort(
    policy: Policy,
    req: Request,
    candidates: Sequence[Backend],
    survivors: Sequence[Backend],
    refused_by: str,
    *,
    loaded_late: bool,
) -> Bind | Refuse:
    """The fallback policy's pick among ``survivors`` (over the slot limit); 503 when there is none."""
    chosen = policy.pick(req, survivors)
    if chosen is None:
        return Refuse(RefusalReason.NO_BACKEND_UP, req.model, "no backend is up", refused_by)
    return _bind(req, candidates, chosen, loaded_late=loaded_late, best_effort=True)


def _bind(
    req: Request, candidates: Sequence[Backend], chosen: str, *, loaded_late: bool = False, best_effort: bool = False
) -> Bind:
    view = next(b for b in candidates if b.id == chosen)
    # Resident: in a GPU slot there (in flight or among the last max-loras to run), so no load.
    in_slot = not req.is_adapter or view.runs(req.model) or req.model in view.warm
    return Bind(chosen, classify(req, view), in_slot, loaded_late, best_effort)
