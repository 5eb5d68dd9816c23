"""When a changed plan may restart the engines: settle, hysteresis, announce, approve. Pure.

vLLM's LoRA flags (--max-loras, --max-lora-rank, --max-cpu-loras) are fixed at start, so a plan
change is a roll of every GPU pod. ``controller.decide`` asks ``decide_replan`` which flags the
engine template carries on this pass, given plain data: the flags the running engine Deployment
has (``engine_flags``), the flags the catalogue asks for now, when the catalogue last changed
(``catalogue_seen``: an in-memory clock the reconciler keeps, seeded from the objects' metadata),
``now``, and the pool's ``spec.lora.replan`` and approval annotation. In order:

1. no engines yet: the first template waits until the catalogue has been quiet ``settleSeconds``
   (a bulk apply's first template sees the whole catalogue);
2. an estimate that moved within its band (grown less than ``GROW_FACTOR``, or shrunk by less
   than ``SHRINK_FACTOR``, same rank) keeps the running flags: not worth a restart, no condition;
3. a catalogue changed less than ``settleSeconds`` ago: keep the running flags, announce, run again
   when the window ends;
4. ``policy: Approval`` and no ``lorapool.io/approve-plan`` naming this change's hash: hold;
5. not yet announced in the pool's status (condition ``EngineRestartPending`` naming the hash):
   announce on this pass, apply on the next;
6. apply.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lorapool.api.clock import unix
from lorapool.api.status import Condition, ConditionStatus, ConditionType

CONDITION = ConditionType.ENGINE_RESTART_PENDING.value
APPROVE_ANNOTATION = "lorapool.io/approve-plan"
GROW_FACTOR = 1.25  # auto --max-loras grows only by more than this: a roll for a few slots is not worth it
SHRINK_FACTOR = 2.0  # ... and shrinks only to half or less: spare slots cost KV cache, a roll costs minutes
_HASH = re.compile(r"\(plan ([0-9a-f]{12})\)")
_FLAGS = ("--max-loras", "--max-lora-rank", "--max-cpu-loras")


@dataclass(frozen=True)
class Flags:
    """The engine flags a plan change restarts the pods for."""

    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int

    def words(self) -> str:
        return f"maxLoras={self.max_loras} maxLoraRank={self.max_lora_rank} maxCpuLoras={self.max_cpu_loras}"


def engine_flags(deployment: Mapping[str, Any] | None) -> Flags | None:
    """The flags the engine Deployment's vllm container runs with; None when there is no such Deployment
    (or it is not one of ours: no readable flags, treated as a first template)."""
    containers = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
    vllm = next((c for c in containers or [] if c.get("name") == "vllm"), None)
    args = [str(a) for a in (vllm or {}).get("args") or []]
    try:
        values = [int(args[args.index(flag) + 1]) for flag in _FLAGS]
    except (ValueError, IndexError):
        return None
    return Flags(*values)


def plan_hash(running: Flags | None, wanted: Flags) -> str:
    """Names one change (from these flags to those): approving it never approves a later, different one."""
    text = f"{running.words() if running else '-'} -> {wanted.words()}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def announced_hash(status: Mapping[str, Any] | None) -> str | None:
    """The change the pool's last written status announced (its EngineRestartPending condition), if any."""
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == CONDITION and c.get("status") == ConditionStatus.TRUE:
            found = _HASH.search(str(c.get("message") or ""))
            return found.group(1) if found else None
    return None


# --- when the catalogue last changed ----------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What the reconciler remembers of a pool's catalogue: its fingerprint and when it last changed."""

    fingerprint: tuple[tuple[str, int | None], ...]
    changed_at: float | None  # Unix seconds; None: long ago (nothing says otherwise)


def catalogue_seen(
    previous: Seen | None, adapters: Sequence[tuple[str, int | None]], stamps: Sequence[float], now: float
) -> Seen:
    """The catalogue's (name, rank) fingerprint and its last change: ``now`` when it differs from the one
    remembered; on first sight (an operator restart) the newest metadata stamp (``metadata_stamps``),
    so a restart alone never delays anything."""
    fingerprint = tuple(sorted(adapters, key=lambda a: (a[0], a[1] or 0)))
    if previous is None:
        return Seen(fingerprint, max(stamps, default=None))
    if previous.fingerprint == fingerprint:
        return previous
    return Seen(fingerprint, now)


def _stamp(text: Any) -> float | None:
    try:
        return unix(str(text)) if text else None
    except ValueError:
        return None


def metadata_stamps(pool: Mapping[str, Any], adapters: Sequence[Mapping[str, Any]]) -> list[float]:
    """When the catalogue's objects last changed, from their metadata: each LoRAAdapter's creation and
    spec writes (managedFields outside the status subresource), and the pool's creation when it
    declares no inline adapters (its adapters are still to come as LoRAAdapters: a GitOps bulk apply)."""
    stamps: list[float] = []
    for body in adapters:
        meta = body.get("metadata") or {}
        times = [meta.get("creationTimestamp")]
        times += [m.get("time") for m in meta.get("managedFields") or [] if m.get("subresource") != "status"]
        stamps += [t for t in map(_stamp, times) if t is not None]
    if not (pool.get("spec") or {}).get("adapters"):
        created = _stamp((pool.get("metadata") or {}).get("creationTimestamp"))
        stamps += [created] if created is not None else []
    return stamps


# --- the decision ------------------------------------------------------------------------------


class Action(StrEnum):
    """What this pass does with the engine template; the values are the condition's reasons."""

    APPLY = "Applied"  # the wanted flags (or unchanged ones)
    KEEP = "WithinBand"  # the running flags: the estimate moved too little to be worth a restart
    FIRST = "FirstTemplateSettling"  # no engine template yet: wait for the catalogue to settle
    SETTLE = "CatalogueSettling"  # the running flags until the catalogue settles
    APPROVAL = "AwaitingApproval"  # the running flags until the change is approved
    ANNOUNCE = "Announced"  # the running flags on this pass: the change is announced, applied next


@dataclass(frozen=True)
class Inputs:
    """Everything ``decide_replan`` reads, as plain data."""

    running: Flags | None  # the engine Deployment's flags; None: no engine template yet
    wanted: Flags  # the plan the catalogue asks for now
    auto: bool  # --max-loras is the estimate (spec 'auto', no sizing loop applying): hysteresis applies
    changed_at: float | None  # the catalogue's last change (Unix seconds); None: long ago
    now: float
    settle_s: float
    approval: bool  # spec.lora.replan.policy: Approval
    approved: str | None = None  # the pool's lorapool.io/approve-plan annotation
    announced: str | None = None  # the hash the pool's last status announced


@dataclass(frozen=True)
class Replan:
    """The verdict: which flags the engine template carries (``render``), and what to say about it."""

    action: Action
    running: Flags | None
    wanted: Flags
    hash: str
    after_s: float | None = None  # run the pool again this much later (the window's end)

    @property
    def held(self) -> bool:
        """True when the engine template keeps (or, first, waits for) flags other than the wanted ones."""
        return self.action not in (Action.APPLY,)

    @property
    def pending(self) -> bool:
        """A restart is pending (the condition is True): announced, settling or awaiting approval."""
        return self.action in (Action.FIRST, Action.SETTLE, Action.APPROVAL, Action.ANNOUNCE)


def _within_band(running: Flags, wanted: Flags) -> bool:
    """True when the estimate moved too little for a restart: same rank, each count grown by at most
    GROW_FACTOR and shrunk to more than 1/SHRINK_FACTOR."""
    if running.max_lora_rank != wanted.max_lora_rank:
        return False
    pairs = ((running.max_loras, wanted.max_loras), (running.max_cpu_loras, wanted.max_cpu_loras))
    return all(new <= old * GROW_FACTOR and new * SHRINK_FACTOR > old for old, new in pairs)


def settling_for(changed_at: float | None, now: float, settle_s: float) -> float:
    """Seconds left until the catalogue has been quiet ``settle_s`` (0: settled); a stamp in the future
    (another clock) counts as now."""
    if changed_at is None or settle_s <= 0:
        return 0.0
    return max(0.0, settle_s - max(0.0, now - changed_at))


def decide_replan(i: Inputs) -> Replan:
    """Which flags the engine template carries on this pass (see the module docstring for the order)."""
    digest = plan_hash(i.running, i.wanted)
    left = settling_for(i.changed_at, i.now, i.settle_s)
    if i.running is None:
        action = Action.FIRST if left > 0 else Action.APPLY
        return Replan(action, None, i.wanted, digest, after_s=left if left > 0 else None)
    if i.running == i.wanted:
        return Replan(Action.APPLY, i.running, i.wanted, digest)
    if i.auto and _within_band(i.running, i.wanted):
        return Replan(Action.KEEP, i.running, i.wanted, digest)
    if left > 0:
        return Replan(Action.SETTLE, i.running, i.wanted, digest, after_s=left)
    if i.approval and i.approved != digest:
        return Replan(Action.APPROVAL, i.running, i.wanted, digest)
    if i.announced != digest:
        return Replan(Action.ANNOUNCE, i.running, i.wanted, digest, after_s=0.0)
    return Replan(Action.APPLY, i.running, i.wanted, digest)


# --- what the pool says ------------------------------------------------------------------------


def message(r: Replan, pool: str, settle_s: float, why: str = "") -> str:
    """The condition's message: the change, its reason, what happens next (and how to approve it)."""
    change = f"{r.running.words() if r.running else 'no engines yet'} -> {r.wanted.words()} (plan {r.hash})"
    because = f"; because {why}" if why else ""
    if r.action == Action.FIRST:
        return (
            f"the first engine template waits until the adapters have not changed for {settle_s:g}s "
            f"(spec.lora.replan.settleSeconds), so it sees the whole catalogue: {change}{because}"
        )
    if r.action == Action.SETTLE:
        return (
            f"restarting the engines for {change}{because}, once the adapters have not changed for "
            f"{settle_s:g}s (spec.lora.replan.settleSeconds); the engines keep the running flags until then"
        )
    if r.action == Action.APPROVAL:
        return (
            f"restarting the engines for {change}{because} waits for approval (spec.lora.replan.policy: "
            f"Approval); the engines keep the running flags. Approve: kubectl annotate lorapool {pool} "
            f"{APPROVE_ANNOTATION}={r.hash} --overwrite"
        )
    if r.action == Action.ANNOUNCE:
        return f"restarting the engines for {change}{because}: announced; the engine pods roll on the next pass"
    return "no engine restart pending: the engines run the plan's flags"


def condition(r: Replan, pool: str, settle_s: float, generation: int | None, why: str = "") -> Condition:
    """EngineRestartPending: True (with the change, its reason and what happens next) while one is pending."""
    reason = r.action.value if r.pending else "NoRestartPending"
    return Condition(
        type=CONDITION,
        status=(ConditionStatus.TRUE if r.pending else ConditionStatus.FALSE).value,
        reason=reason,
        message=message(r, pool, settle_s, why) if r.pending else message(r, pool, settle_s),
        observed_generation=generation,
    )


def announcement(r: Replan, before: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(reason, type) of the Event to post when a restart is newly pending: the condition turns True or
    changes reason, or a different change awaits approval. A catalogue still arriving changes the wanted
    flags on every pass: one Event for the whole settle window, not one per pass. None: nothing new."""
    if not r.pending:
        return None
    last: Mapping[str, Any] = next(
        (c for c in (before or {}).get("conditions") or [] if c.get("type") == CONDITION), {}
    )
    same = last.get("status") == ConditionStatus.TRUE and last.get("reason") == r.action.value
    if same and (r.action != Action.APPROVAL or announced_hash(before) == r.hash):
        return None
    return (CONDITION, "Warning" if r.action == Action.APPROVAL else "Normal")
