"""The sizing step of a reconcile: status.recommendation, and the opt-in loop that applies it. Pure.

``controller.reconcile`` hands over the pool, its plan, its current ``status.sizing`` and its
engine pods; this module reads the sidecars' reports on the pods (their ``obs``: the one channel,
no engine is polled), recommends a --max-loras (``plan.sizing.recommend``) and, when
``spec.lora.tuning.apply`` is on, decides the change with guard rails:

- bounded steps: one change moves --max-loras by at most ``maxStepFactor`` up or down;
- rate limit: at most one change (or rollback) per ``minPeriodSeconds``;
- rollout under the PDB: the change is a plan change, so the engine Deployment rolls its pods with
  maxUnavailable 1 / maxSurge 0, the same budget as the pool's PodDisruptionBudget;
- judged: the baseline (p99 TTFT, goodput) of the window before is kept; once engines running the
  new value have reported a window that started after the change, a p99 TTFT higher or a goodput
  lower by more than ``rollbackMargin`` rolls it back, and the rolled-back direction is not tried
  again as far while the recommendation stays there;
- every change, verdict and rollback is an Event with its reason.

Engines' observations count only when their ``max_loras`` label is the value being judged, so
windows of pods still running the old flags never blur a comparison. A change and a verdict wait
for a window from every serving engine pod: goodput is the pool's sum over replicas, so a baseline
or a judgement read from one of two replicas would halve it (a false rollback, or a baseline too
low to ever roll back against).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.clock import rfc3339, unix
from lorapool.api.models import AUTO, LoRAPool, SizingTuning
from lorapool.api.pods import EnginePod
from lorapool.api.report import Observations
from lorapool.api.status import RecommendationStatus, SizingStatus
from lorapool.controller.decide import Event
from lorapool.plan.planner import Plan
from lorapool.plan.sizing import MIN_SAMPLES, Action, Evidence, Recommendation, pool_evidence, recommend

MAX_AGE_S = 300.0  # a report's window older than this is not evidence (a stuck sidecar, a dead engine)
WATCHING, KEPT, ROLLED_BACK = "Watching", "Kept", "RolledBack"


@dataclass(frozen=True)
class PodWindow:
    """One engine pod's last window, as its sidecar reported it."""

    pod: str
    observations: Observations

    @property
    def start(self) -> float:
        return self.observations.end - self.observations.window_s


def serving_pods(pods: Sequence[EnginePod]) -> int:
    """The serving (Ready, non-terminating) engine pods: each must have reported before the loop acts."""
    return sum(1 for pod in pods if pod.serving)


def pod_windows(pods: Sequence[EnginePod], now: float, max_age_s: float = MAX_AGE_S) -> list[PodWindow]:
    """The fresh windows of serving (Ready, non-terminating) engine pods, by pod name."""
    windows: list[PodWindow] = []
    for pod in sorted(pods, key=lambda p: p.name):
        obs = pod.report.observations if pod.serving and pod.report is not None else None
        if obs is not None and obs.end >= now - max_age_s:
            windows.append(PodWindow(pod.name, obs))
    return windows


def current_sizing(body: Mapping[str, Any]) -> SizingStatus | None:
    """``status.sizing`` as the API server has it; None when absent or unreadable."""
    raw = (body.get("status") or {}).get("sizing")
    if not isinstance(raw, dict):
        return None
    try:
        return SizingStatus.model_validate(raw)
    except ValueError:
        return None


def tuned_max_loras(pool: LoRAPool, body: Mapping[str, Any]) -> int | None:
    """The --max-loras the loop applies now, for the planner; None when the loop is off."""
    tuning = pool.spec.lora.tuning
    if tuning is None or not tuning.apply or pool.spec.lora.max_loras != AUTO:
        return None
    sizing = current_sizing(body)
    return sizing.applied_max_loras if sizing else None


@dataclass(frozen=True)
class SizingResult:
    recommendation: RecommendationStatus | None
    sizing: SizingStatus | None
    events: tuple[Event, ...] = field(default=())


def recommendation_status(r: Recommendation) -> RecommendationStatus:
    return RecommendationStatus(
        max_loras=r.max_loras,
        current=r.current,
        action=r.action.value,
        kv_cache_bytes=r.kv_bytes,
        kv_cache_tokens=r.kv_tokens,
        evidence=r.evidence,
        window_seconds=r.window_s or None,
        replicas=r.replicas,
        samples=r.samples,
        observed_at=rfc3339(r.end) if r.end is not None else None,
    )


def size(
    pool: LoRAPool,
    plan: Plan | None,
    sizing: SizingStatus | None,
    windows: Sequence[PodWindow],
    now: float,
    *,
    serving: int,
) -> SizingResult:
    """status.recommendation and status.sizing for this reconcile, and the Events of any change.

    ``serving``: the engine pods serving now (``serving_pods``); a change or a verdict waits until
    each has a window on the value in question."""
    if plan is None or plan.slots is None:
        return SizingResult(None, sizing)
    running_now = [w.observations for w in windows if w.observations.max_loras == plan.max_loras]
    evidence = pool_evidence(running_now)
    rec = recommend(evidence, plan.slots)
    status = recommendation_status(rec)
    tuning = pool.spec.lora.tuning
    if tuning is None or not tuning.apply or pool.spec.lora.max_loras != AUTO:
        events: tuple[Event, ...] = ()
        if sizing is not None:
            events = (Event("SizingStopped", "spec.lora.tuning.apply is off: --max-loras returns to auto's estimate"),)
        return SizingResult(status, None, events)
    if sizing is not None and sizing.verdict == WATCHING:
        return SizingResult(status, *_judge(sizing, tuning, windows, now, serving))
    if sizing is not None and now - unix(sizing.last_change_time) < tuning.min_period_seconds:
        return SizingResult(status, sizing)
    if rec.action not in (Action.GROW, Action.SHRINK) or evidence is None or len(running_now) < serving:
        return SizingResult(status, sizing)
    return SizingResult(status, *_change(plan.max_loras, rec, evidence, sizing, tuning, now))


def bounded_step(current: int, target: int, factor: float) -> int:
    """``target`` moved no further than ``factor`` times (or 1/factor times) ``current``."""
    low, high = max(1, math.ceil(current / factor)), max(current + 1, math.floor(current * factor))
    return min(max(target, low), high)


def _change(
    current: int, rec: Recommendation, e: Evidence, sizing: SizingStatus | None, tuning: SizingTuning, now: float
) -> tuple[SizingStatus | None, tuple[Event, ...]]:
    target = bounded_step(current, rec.max_loras, tuning.max_step_factor)
    rejected = sizing.rejected_max_loras if sizing else None
    same_way = rejected is not None and (target - current) * (rejected - current) > 0
    if rejected is not None and same_way and abs(target - current) >= abs(rejected - current):
        return sizing, ()  # the last try that far in this direction was rolled back
    step = "" if target == rec.max_loras else f" (bounded step: at most x{tuning.max_step_factor:g} per change)"
    reason = f"--max-loras {current} -> {target}{step}: {rec.evidence}"
    applied = SizingStatus(
        applied_max_loras=target,
        previous_max_loras=current,
        last_change_time=rfc3339(now),
        reason=reason,
        verdict=WATCHING,
        baseline_ttft_p99_seconds=e.ttft_p99_s,
        baseline_goodput=round(e.goodput, 4),
        rejected_max_loras=rejected,
    )
    return applied, (Event("SizingApplied", reason),)


def _judge(
    s: SizingStatus, tuning: SizingTuning, windows: Sequence[PodWindow], now: float, serving: int
) -> tuple[SizingStatus, tuple[Event, ...]]:
    """Compare the window after the change with the one before; keep watching until every serving
    engine runs the new value and has reported a window that started after the change."""
    since = unix(s.last_change_time)
    judged = [w.observations for w in windows if w.observations.max_loras == s.applied_max_loras and w.start >= since]
    after = pool_evidence(judged)
    if after is None or after.samples < MIN_SAMPLES or len(judged) < serving:
        return s, ()
    margin = tuning.rollback_margin
    worse: list[str] = []
    kept: list[str] = []
    if s.baseline_ttft_p99_seconds is not None and after.ttft_p99_s is not None:
        words = f"p99 TTFT {s.baseline_ttft_p99_seconds:.3g} s -> {after.ttft_p99_s:.3g} s"
        limit = s.baseline_ttft_p99_seconds * (1 + margin)
        (worse if after.ttft_p99_s > limit else kept).append(words)
    if s.baseline_goodput is not None:
        words = f"goodput {s.baseline_goodput:.3g} -> {after.goodput:.3g} req/s"
        (worse if after.goodput < s.baseline_goodput * (1 - margin) else kept).append(words)
    window = f"over {after.window_s:.0f} s on {after.replicas} replica(s) after the change"
    if worse:
        reason = (
            f"--max-loras {s.applied_max_loras} -> {s.previous_max_loras} (rolled back): {', '.join(worse)} {window}, "
            f"worse than the {margin:.0%} margin (spec.lora.tuning.rollbackMargin)"
        )
        back = SizingStatus(
            applied_max_loras=s.previous_max_loras,
            previous_max_loras=s.applied_max_loras,
            last_change_time=rfc3339(now),
            reason=reason,
            verdict=ROLLED_BACK,
            rejected_max_loras=s.applied_max_loras,
        )
        return back, (Event("SizingRolledBack", reason, "Warning"),)
    message = f"--max-loras {s.applied_max_loras} kept: {', '.join(kept) or 'no latency signal'} {window}"
    return s.model_copy(update={"verdict": KEPT}), (Event("SizingKept", message),)
