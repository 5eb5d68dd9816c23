"""What the engines' sidecars report, as the router routes by it. Pure.

Each engine pod's adapter-sync sidecar writes what its engine holds on its own Pod
(``lorapool.api.report``, docs/status.md). The router watches the pool's engine pods, keeps one
``lorapool.api.pods.EnginePod`` per pod (its report decoded once per change), maps each backend URL to its pod (``backend_reports``: by
the pod name an EndpointSlice's ``targetRef`` or ``--backend-pod`` gives, else by pod IP) and
decides per request from those reports (``standing``):

- **loaded** on some replica: the request goes only to the replicas that hold it
  (``served``: the engine holds some identity of it, the desired one or, during a hot swap or
  after a failed one, the previous one; not while it is being unloaded);
- **loading** somewhere and loaded nowhere: the request waits up to the router's max wait, then
  503 with ``Retry-After``;
- **failed** on every replica that reports it: 404 with the sidecar's reason;
- **unknown** to every report: 404 saying the adapter is not in the pool;
- **unreported** (no backend has a usable report: a local router without Kubernetes, or pods
  whose sidecars have not written yet): today's behaviour, ``/v1/models`` decides.

A report is a fact about one pod: a pod that is terminating, not Ready, or whose annotation
does not decode gives none (``EnginePod.usable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from lorapool.api.pods import EnginePod
from lorapool.api.report import IN_PROGRESS, ReplicaPhase, ReplicaReport


def _host(url: str) -> str:
    """The host of ``http://HOST:PORT/...`` (IPv6 without its brackets), as a pod IP reads."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if ":" in authority else authority


def backend_reports(
    backends: Iterable[str], pods: Mapping[str, EnginePod], pod_of: Mapping[str, str]
) -> dict[str, ReplicaReport | None]:
    """Each backend's usable report: its pod by name (``pod_of``: URL -> pod), else by pod IP."""
    by_ip = {p.ip: p for p in pods.values() if p.ip}
    found: dict[str, ReplicaReport | None] = {}
    for url in backends:
        name = pod_of.get(url)
        facts = pods.get(name) if name else by_ip.get(_host(url))
        found[url] = facts.usable if facts is not None else None
    return found


def served(report: ReplicaReport) -> frozenset[str]:
    """Adapters the engine holds and serves by name (any identity; not while being unloaded)."""
    return frozenset(
        name for name, a in report.adapters.items() if a.loaded is not None and a.phase != ReplicaPhase.UNLOADING
    )


class Standing(StrEnum):
    """Where an adapter stands across the pool, as the reports say."""

    LOADED = "loaded"  # some replica holds it: route there
    LOADING = "loading"  # none holds it, some is loading it: hold, then 503
    FAILED = "failed"  # every replica that knows it failed: 404 with the sidecar's reason
    UNKNOWN = "unknown"  # no report knows it: 404, not in the pool
    UNREPORTED = "unreported"  # no report at all: /v1/models decides (today's behaviour)


@dataclass(frozen=True)
class Verdict:
    """An adapter's standing, the replicas that hold it and, for a 404, why."""

    standing: Standing
    loaded_on: tuple[str, ...] = ()
    loading_on: int = 0
    reason: str = ""


def standing(model: str, reports: Mapping[str, ReplicaReport | None], in_pool: bool | None = None) -> Verdict:
    """Where ``model`` stands over the backends' reports (backend id -> report or None).

    ``in_pool``: whether the pool's adapter set names it (None: the router does not read the set). An
    adapter the set names but no report knows yet is loading, not missing: the sidecars learn of it
    first, then report; a request for it holds rather than being told it does not exist, which is what
    lets Ready (read from the reports) imply routable on every router."""
    verdict = _reported(model, reports)
    if verdict.standing == Standing.UNKNOWN and in_pool:
        why = f"adapter {model!r} is in the pool's adapter set and not loaded on any replica yet"
        return Verdict(Standing.LOADING, reason=why)
    return verdict


def _reported(model: str, reports: Mapping[str, ReplicaReport | None]) -> Verdict:
    loaded: list[str] = []
    loading = unloading = 0
    failures: list[str] = []
    reported = 0
    for backend, report in reports.items():
        if report is None:
            continue
        reported += 1
        if model in served(report):
            loaded.append(backend)
            continue
        entry = report.adapters.get(model)
        if entry is None:
            continue
        if entry.phase in IN_PROGRESS:
            loading += 1
        elif entry.phase == ReplicaPhase.FAILED:
            failures.append(entry.message or "failed (no reason given)")
        elif entry.phase == ReplicaPhase.UNLOADING:
            unloading += 1
    if loaded:
        return Verdict(Standing.LOADED, tuple(sorted(loaded)), loading)
    if loading:
        return Verdict(Standing.LOADING, (), loading, f"adapter {model!r} is loading on {loading} replica(s)")
    if not reported:
        return Verdict(Standing.UNREPORTED)
    if failures:
        why = f"adapter {model!r} failed to load on {len(failures)} replica(s): {failures[0]}"
        return Verdict(Standing.FAILED, reason=why)
    if unloading:
        why = f"adapter {model!r} is being removed from the pool (unloading on {unloading} replica(s))"
        return Verdict(Standing.UNKNOWN, reason=why)
    why = f"adapter {model!r} is not in the pool's adapter set (no replica's sidecar reports it)"
    return Verdict(Standing.UNKNOWN, reason=why)
