"""Kubelet faults under traffic (issue 48 item 2): the fault table, what each request and status
sample came to, the verdicts and the report row. Pure: the shell that injects the faults, sends the
requests and samples the pool is `tests/node/test_faults_real.py`.

A request ends in one of three ways. Answered (a 2xx) or a clean error (any HTTP status, or a
connection refused before anything was sent: the client knows nothing ran and may retry) are
fine. Neither (a timeout, or a connection cut after the request went out) is what a fault must
never cause: the client cannot tell whether its request ran. A SIGKILLed router is the one
exception no server can avoid (the requests it held die with it), so that fault reports its
resets but is not failed for them.

`LORAPOOL_FAULTS` picks the faults a run injects: unset, the CI set (the cheapest that cover
distinct code paths); `all`; or names separated by commas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

SELECT_ENV = "LORAPOOL_FAULTS"
RETRIES_METRIC = "lorapool_router_retries_total"
HUNG = "timeout"  # no answer within the client's deadline
RESET = "reset"  # the connection was cut after the request went out
REFUSED = "refused"  # nothing listened: the request never left (clean)
LAG_S = 10.0  # how long status may trail the pods before a disagreement counts as a lie


@dataclass(frozen=True)
class Fault:
    """One fault: what is done, whether CI runs it, what the status must show while it lasts."""

    name: str
    what: str
    ci: bool
    loaded_dips: bool = False  # an engine is lost: some adapter's loadedReplicas must drop, then return
    ready_drops: bool = False  # the engines roll: the pool's Ready must go False, then True
    available_stays: bool = True  # a replica serves throughout: Available must stay True
    resets_allowed: bool = False  # see the module docstring


FAULTS = (
    Fault("engine-kill", "an engine container SIGKILLed (as an OOM kill)", ci=True, loaded_dips=True),
    Fault("engine-delete", "an engine pod deleted (SIGTERM, preStop, drain)", ci=False, loaded_dips=True),
    Fault("flag-roll", "spec.vllm.extraArgs changed: the engines roll", ci=True, loaded_dips=True, ready_drops=True),
    Fault("evict", "cordon, evict an engine pod under its PDB, uncordon", ci=False, loaded_dips=True),
    Fault("kubelet-stop", "the kubelet stopped until the node is NotReady, then started", ci=False),
    Fault("bad-image", "a roll to an image tag that does not exist, then rolled back", ci=False, ready_drops=True),
    Fault("router-kill", "a router container SIGKILLed (one of two)", ci=True, resets_allowed=True),
    Fault("operator-kill", "the operator container SIGKILLed", ci=False),
)
BY_NAME = {f.name: f for f in FAULTS}


def selected(value: str | None) -> list[Fault]:
    """The faults `LORAPOOL_FAULTS` asks for, in table order; a clear error for an unknown name."""
    if not value or not value.strip():
        return [f for f in FAULTS if f.ci]
    if value.strip() == "all":
        return list(FAULTS)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        known = ", ".join(BY_NAME)
        raise ValueError(f"{SELECT_ENV}: unknown fault {', '.join(unknown)}; use all or some of: {known}")
    return [f for f in FAULTS if f.name in names]


@dataclass(frozen=True)
class Outcome:
    """One request: when it started (seconds from the fault), how long it took, how it ended."""

    start_s: float
    seconds: float
    status: int | None = None  # the HTTP status; None when there was none
    error: str = ""  # REFUSED, RESET or HUNG when there was no status
    detail: str = ""  # the start of an error's body: why, in the server's words

    @property
    def clean(self) -> bool:
        return self.status is not None or self.error == REFUSED


@dataclass(frozen=True)
class Sample:
    """One look at the cluster: the truth (pods) beside what the pool's status says."""

    at_s: float
    engines_ready: int  # engine pods Ready with the pool's current template
    engines_wanted: int
    routers_ready: int
    routers_wanted: int
    ready: bool | None  # the pool's conditions
    available: bool | None
    loaded: tuple[int, ...]  # each adapter's status.adapters[].loadedReplicas
    loaded_wanted: int  # what each adapter's loadedReplicas is at full capacity
    converged: bool = True  # both Deployments run their current template on every replica

    @property
    def full(self) -> bool:
        """Full capacity, as the pods show it."""
        wanted = self.engines_ready >= self.engines_wanted and self.routers_ready >= self.routers_wanted
        return self.converged and wanted

    @property
    def status_full(self) -> bool:
        return bool(self.ready and self.available) and all(n >= self.loaded_wanted for n in self.loaded)


@dataclass(frozen=True)
class Result:
    fault: Fault
    requests: int
    answered: int
    unclean: int  # neither an answer nor a clean error
    errors: Mapping[str, int]  # clean errors and unclean endings by status (or kind)
    retries: Mapping[str, int]  # the routers' retries before a first byte, by reason
    recovered_s: float | None  # time from the fault to full capacity (pods and status) again
    p99_s: float
    problems: tuple[str, ...] = field(default=())  # what the verdict found wrong
    seen: str = ""  # what the pods and the status showed meanwhile (`observed`)


def retries(page: str) -> dict[str, int]:
    """`lorapool_router_retries_total` by reason from one router's /metrics page."""
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == RETRIES_METRIC:
                out[s.labels.get("reason", "")] += int(s.value)
    return dict(out)


def retries_delta(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Retries during the fault, summed over routers (pod name -> reason -> count). A router that
    is new (restarted) counts from zero."""
    out: Counter[str] = Counter()
    for pod, counts in after.items():
        old = before.get(pod, {})
        for reason, n in counts.items():
            out[reason] += max(0, n - old.get(reason, 0))
    return {k: v for k, v in sorted(out.items()) if v}


def recovered_at(samples: Sequence[Sample]) -> float | None:
    """When pods and status were last seen reaching full capacity (the first sample after the last
    one that was not full); 0 when no sample was below it; None when it never came back."""
    if not samples or not (samples[-1].full and samples[-1].status_full):
        return None
    short = [i for i, s in enumerate(samples) if not (s.full and s.status_full)]
    return 0.0 if not short else samples[short[-1] + 1].at_s


def _lasting(samples: Sequence[Sample], wrong: Callable[[Sample], bool]) -> Sample | None:
    """The first sample of a run of wrong ones that lasted LAG_S or more (or reached the end)."""
    start: Sample | None = None
    for s in samples:
        if not wrong(s):
            start = None
            continue
        start = start or s
        if s.at_s - start.at_s >= LAG_S:
            return start
    return start if start is not None and start is samples[-1] else None


def status_lies(fault: Fault, samples: Sequence[Sample]) -> list[str]:
    """Where the pool's status said other than the pods for LAG_S or more (the controller reacts
    to a change within a few seconds: a shorter disagreement is its reaction time, not a lie)."""
    lies = []
    serving = _lasting(samples, lambda s: s.available is False and s.engines_ready > 0 and s.routers_ready > 0)
    if serving and fault.available_stays:
        lies.append(
            f"Available False from {serving.at_s:.1f}s while {serving.engines_ready} engines and a router served"
        )
    idle = _lasting(samples, lambda s: bool(s.available) and (s.engines_ready == 0 or s.routers_ready == 0))
    if idle:
        lies.append(
            f"Available True from {idle.at_s:.1f}s with {idle.engines_ready} engines, {idle.routers_ready} routers"
        )
    lost = any(s.engines_ready < s.engines_wanted for s in samples)  # the pods show an engine down
    if fault.loaded_dips and lost and not any(n < s.loaded_wanted for s in samples for n in s.loaded):
        lies.append("no adapter's loadedReplicas dropped although an engine was down")
    if fault.ready_drops and not any(s.ready is False for s in samples):
        lies.append("Ready never went False during the roll")
    return lies


def _false_span(samples: Sequence[Sample], attr: str) -> str:
    """From the first to the last sample whose condition `attr` was False; empty if none was."""
    times = [s.at_s for s in samples if getattr(s, attr) is False]
    return f"{times[0]:.0f}-{times[-1]:.0f} s" if times else ""


def observed(samples: Sequence[Sample]) -> str:
    """In a few words: the fewest ready engines and routers the pods showed, the lowest
    loadedReplicas the status showed, and when Ready and Available were False."""
    if not samples:
        return "no sample"
    first = samples[0]
    parts = [
        f"engines ready >= {min(s.engines_ready for s in samples)}/{first.engines_wanted}",
        f"routers >= {min(s.routers_ready for s in samples)}/{first.routers_wanted}",
        f"loadedReplicas >= {min((n for s in samples for n in s.loaded), default=0)}/{first.loaded_wanted}",
    ]
    for name, attr in (("Ready", "ready"), ("Available", "available")):
        span = _false_span(samples, attr)
        parts.append(f"{name} False {span}" if span else f"{name} True throughout")
    return ", ".join(parts)


def judge(fault: Fault, outcomes: Iterable[Outcome], samples: Sequence[Sample], retried: Mapping[str, int]) -> Result:
    """The fault's numbers and what is wrong with them."""
    done = list(outcomes)
    errors: Counter[str] = Counter()
    for o in done:
        if not (o.status is not None and 200 <= o.status < 300):
            errors[str(o.status) if o.status is not None else o.error] += 1
    unclean = sum(1 for o in done if not o.clean)
    resets = sum(1 for o in done if o.error == RESET)
    problems = status_lies(fault, samples)
    allowed = resets if fault.resets_allowed else 0
    if unclean > allowed:
        problems.append(f"{unclean - allowed} requests had neither an answer nor a clean error")
    missing = sum(1 for o in done if o.status == 404)  # every request names an adapter the pool serves
    if missing:
        problems.append(f"{missing} requests for an adapter the pool serves were answered 404")
    recovered = recovered_at(samples)
    if recovered is None:
        problems.append("never back to full capacity")
    times = sorted(o.seconds for o in done)
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))] if times else 0.0
    answered = sum(1 for o in done if o.status is not None and 200 <= o.status < 300)
    numbers = (len(done), answered, unclean, dict(errors), dict(retried), recovered, p99)
    return Result(fault, *numbers, problems=tuple(problems), seen=observed(samples))


HEADER = (
    "| Fault | CI | Requests | Answered | Neither answer nor clean error | Clean errors | "
    "Retried before first byte | Full capacity again | p99 | Pods and status meanwhile | Status told the truth |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: Result) -> str:
    """The docs table's row for one fault."""
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items()) if k not in (HUNG, RESET)) or "0"
    retried = ", ".join(f"{k}: {v}" for k, v in r.retries.items()) or "0"
    recovered = "never" if r.recovered_s is None else f"{r.recovered_s:.0f} s"
    lies = [p for p in r.problems if "requests " not in p and "never back" not in p]
    truth = "yes" if not lies else "no: " + "; ".join(lies)
    unclean = str(r.unclean) + (
        " (resets of requests on the killed router)" if r.unclean and r.fault.resets_allowed else ""
    )
    cells = (r.fault.what, "yes" if r.fault.ci else "on demand", r.requests, r.answered, unclean, errors, retried)
    return "| " + " | ".join(str(c) for c in (*cells, recovered, f"{r.p99_s:.1f} s", r.seen, truth)) + " |"


def report(results: Iterable[Result]) -> str:
    return "\n".join([HEADER, *(row(r) for r in results)])
