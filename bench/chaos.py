"""The chaos cell: one replica SIGKILLed mid-run and restarted on its port, the open loop unbroken.

    python bench/run.py --chaos     # ~5 min: bench/results/chaos.json, chaos_requests.json, chaos.png; RESULTS.md

Regime (a) as ``a-uniform-poisson`` runs it (4 ``lorapool sim`` replicas x ``--max-loras 4``,
16 adapters, Poisson 40 req/s, ``--time-scale 4``), for ``DURATION_S`` simulated seconds. At
``KILL_AT_S`` replica ``VICTIM``'s process gets SIGKILL (the bench runs no sidecar: the simulator
is the whole pod, so this is what a pod crash kills); ``OUTAGE_S`` later the same command starts
again on the same port, cold (empty GPU slots and CPU cache), as a restarted container would. The
load generator keeps its schedule throughout. Each compared system gets fresh replicas and the
same schedule.

From the per-request records (kept in ``chaos_requests.json``) pure functions compute the
accounting (every request sent is answered, errored by kind, or vanished), the goodput
timeline, its dip and the recovery time, and which replica answered (the router's
``X-Lorapool-Backend``); the router's /metrics, read through the run, say when it took the
victim out of rotation and back. ``section`` renders them for RESULTS.md; the shell (``run``)
drives the processes. All times in the records and results are simulated seconds since the
first arrival.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.loadgen import Outcome, RunResult, run_open_loop, schedule
from bench.scenarios import LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN, SCENARIOS, SYSTEMS, Scenario
from bench.systems import System, start_replica, write_adapters
from lorapool_dev.testing.components import Component

RESULTS_FILE = "chaos.json"
REQUESTS_FILE = "chaos_requests.json"
PLOT_FILE = "chaos.png"
COMPARED = (LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN)
DURATION_S = 32.0  # simulated seconds of arrivals: 2.5 warm-up, 9.5 before the kill, 20 after
KILL_AT_S = 12.0
# A request here lasts up to ~3 s (queueing, TTFT and 64 tokens): those sent in the last GUARD_S
# before the kill may still run on the victim when it dies, so they belong to the dip, not the level.
GUARD_S = 3.0
OUTAGE_S = 5.0  # from the kill to the restart command (a crashed container's first restart is ~10 s in Kubernetes)
VICTIM = 0  # which replica dies
BIN_S = 1.0  # goodput timeline resolution (40 arrivals a bin at 40 req/s)
# Recovered = within 10 % of the pre-kill goodput share from some bin to the end of the run (at
# least SUSTAIN_BINS bins: a system back for a moment and then out again has not recovered). 10 % is
# above the noise of a healthy 1-s bin (binomial: at the affinity router's ~95 % share and 40
# requests a bin, one standard deviation is ~3.5 points, so 10 % is ~2.7 of them: the
# "pre-kill bins outside the band" column checks it), and well below a replica's worth (25 %).
BAND = 0.10
SUSTAIN_BINS = 3
WATCH_EVERY_S = 0.25  # how often the router's /metrics is read (simulated seconds)
DRAIN_S = 20.0  # requests unfinished this long after the last arrival count as vanished

_BASE = next(s for s in SCENARIOS if s.name == "a-uniform-poisson")
SCENARIO = Scenario(
    "a-chaos-kill-one",
    "a",
    _BASE.about,
    _BASE.fleet,
    dataclasses.replace(_BASE.workload, duration_s=DURATION_S),
    warmup_s=_BASE.warmup_s,
    slo_ttft_s=_BASE.slo_ttft_s,
)

# What a request's client saw, one of these (kinds of error beyond the named ones read "HTTP <code>").
ANSWERED = "answered"
REFUSED = "503 Retry-After"
SSE_ERROR = "mid-stream SSE error"
CONNECTION = "connection error"
TIMED_OUT = "no answer or error within its timeout"
TRUNCATED = "stream ended without [DONE] or an error"
VANISHED = (TIMED_OUT, TRUNCATED)

Record = Mapping[str, Any]
FIELDS = (
    "model",
    "sent_s",
    "status",
    "ttft_s",
    "done_s",
    "tokens",
    "error",
    "retry_after",
    "sse_error",
    "finished",
    "backend",
)


# --- pure: accounting, timeline, dip -----------------------------------------------------------
def record(o: Outcome, scale: float) -> dict[str, Any]:
    """One request as plain data, times in simulated seconds."""

    def sim(x: float | None) -> float | None:
        return None if x is None else round(x / scale, 4)

    return {
        "model": o.model, "sent_s": sim(o.sent_s), "status": o.status, "ttft_s": sim(o.ttft_s),
        "done_s": sim(o.done_s), "tokens": o.tokens, "error": o.error[:160], "retry_after": o.retry_after,
        "sse_error": o.sse_error, "finished": o.finished, "backend": o.backend,
    }  # fmt: skip


def kind(r: Record) -> str:
    """How one request ended, as its client saw it."""
    if r["done_s"] is None:
        return TIMED_OUT
    status = r["status"]
    if status == 200:
        if r["sse_error"]:
            return SSE_ERROR
        if r["error"]:
            return CONNECTION  # the connection broke mid-stream
        return ANSWERED if r["finished"] else TRUNCATED
    if status == 0:
        return CONNECTION
    if status == 503 and r["retry_after"]:
        return REFUSED
    return f"HTTP {status}"


def account(records: Sequence[Record], planned: int) -> dict[str, Any]:
    """Sent = answered + errored + vanished, errors by kind; ``planned`` is the schedule's length."""
    kinds = Counter(kind(r) for r in records)
    answered = kinds.pop(ANSWERED, 0)
    vanished = {k: kinds.pop(k) for k in VANISHED if k in kinds}
    errors = dict(sorted(kinds.items()))
    return {
        "planned": planned,
        "sent": len(records),
        "answered": answered,
        "errored": sum(errors.values()),
        "errors": errors,
        "vanished": sum(vanished.values()),
        "vanished_kinds": vanished,
    }


def good(r: Record, slo_ttft_s: float) -> bool:
    return kind(r) == ANSWERED and r["ttft_s"] is not None and r["ttft_s"] <= slo_ttft_s


def timeline(records: Sequence[Record], *, end_s: float, bin_s: float, slo_ttft_s: float) -> list[dict[str, Any]]:
    """Per bin of send time: requests sent, good (answered within the TTFT SLO), errored, vanished."""
    bins = [{"t_s": round(i * bin_s, 6), "sent": 0, "good": 0, "errored": 0, "vanished": 0}
            for i in range(math.ceil(end_s / bin_s))]  # fmt: skip
    for r in records:
        i = min(len(bins) - 1, int(r["sent_s"] // bin_s))
        b, k = bins[i], kind(r)
        b["sent"] += 1
        b["good"] += good(r, slo_ttft_s)
        b["vanished"] += k in VANISHED
        b["errored"] += k not in VANISHED and k != ANSWERED
    return bins


def _share(b: Mapping[str, Any]) -> float | None:
    return b["good"] / b["sent"] if b["sent"] else None


def dip(
    bins: Sequence[Mapping[str, Any]],
    *,
    warmup_s: float,
    kill_s: float,
    ready_s: float | None,
    bin_s: float,
    guard_s: float = GUARD_S,
    band: float = BAND,
    sustain: int = SUSTAIN_BINS,
) -> dict[str, Any]:
    """The goodput dip around the kill and the recovery after the restart.

    Goodput is read as a share: good requests / requests sent, per bin of send time (the
    schedule is open loop, so this is goodput over offered load; it takes the Poisson noise of
    arrivals out). The dip window starts ``guard_s`` before the kill (requests sent then may
    still run on the victim when it dies), at a bin edge. ``level`` is the share from the
    warm-up's end to the dip window; a bin is inside the band when its share is
    >= (1 - band) x level. Depth: how far the worst bin of the dip window fell below the level.
    Duration: its bins outside the band, times ``bin_s``. Recovered at: the start of the first
    bin, from the one holding ``ready_s`` on, after which every bin to the end of the run is
    inside the band, with at least ``sustain`` bins left; recovery = that minus ``ready_s`` (0
    when goodput was back before the replica was). None when it did not stay back within the run.
    """
    edge = math.floor((kill_s - guard_s) / bin_s + 1e-9) * bin_s
    pre = [b for b in bins if b["t_s"] >= warmup_s and b["t_s"] + bin_s <= edge + 1e-9]
    sent, ok = sum(b["sent"] for b in pre), sum(b["good"] for b in pre)
    level = ok / sent if sent else math.nan
    threshold = (1.0 - band) * level
    after = [b for b in bins if b["t_s"] >= edge - 1e-9 and b["sent"]]
    shares = [(b["t_s"], _share(b) or 0.0) for b in after]
    worst_t, worst = min(shares, key=lambda x: x[1], default=(None, math.nan))
    low = [t for t, s in shares if s < threshold]
    recovered_at = None
    if ready_s is not None:
        start = math.floor(ready_s / bin_s + 1e-9) * bin_s
        candidates = [(t, s) for t, s in shares if t >= start - 1e-9]
        for i, (t, _) in enumerate(candidates):
            rest = candidates[i:]
            if len(rest) >= sustain and all(s >= threshold for _, s in rest):
                recovered_at = t
                break
    return {
        "dip_from_s": edge,
        "level_share": level,
        "level_rps": ok / (len(pre) * bin_s) if pre else math.nan,
        "threshold_share": threshold,
        "noise_bins": sum(1 for b in pre if (_share(b) or 0.0) < threshold),
        "pre_bins": len(pre),
        "worst_share": worst,
        "worst_at_s": worst_t,
        "depth_pct": 100.0 * (1.0 - worst / level) if level else math.nan,
        "below_s": len(low) * bin_s,
        "first_below_s": low[0] if low else None,
        "last_below_end_s": low[-1] + bin_s if low else None,
        "recovered_at_s": recovered_at,
        "recovery_s": None if recovered_at is None or ready_s is None else max(0.0, recovered_at - ready_s),
    }


def router_view(samples: Sequence[Mapping[str, Any]], *, kill_s: float, ready_s: float | None) -> dict[str, Any]:
    """From the router's /metrics samples of the victim: when it left rotation after the kill and
    came back after the restart (first sample showing it; resolution ``WATCH_EVERY_S``)."""
    down = next((s["t_s"] for s in samples if s["t_s"] >= kill_s and not s["up"]), None)
    back = None
    if ready_s is not None:
        back = next((s["t_s"] for s in samples if s["t_s"] >= ready_s and s["up"]), None)
    return {
        "down_after_kill_s": None if down is None else down - kill_s,
        "up_after_ready_s": None if back is None or ready_s is None else back - ready_s,
        "samples": len(samples),
    }


def served(
    records: Sequence[Record], victim: str, *, warmup_s: float, kill_s: float, ready_s: float | None, slo_ttft_s: float
) -> dict[str, Any]:
    """The victim's part before the kill and after its restart (from the X-Lorapool-Backend header):
    requests answered there as a share of those sent, and the good share there vs elsewhere."""

    def part(rs: Sequence[Record]) -> dict[str, Any]:
        mine = [r for r in rs if r.get("backend") == victim]
        rest = [r for r in rs if r.get("backend") and r.get("backend") != victim]
        return {
            "sent": len(rs),
            "victim": len(mine),
            "victim_good": sum(good(r, slo_ttft_s) for r in mine),
            "elsewhere": len(rest),
            "elsewhere_good": sum(good(r, slo_ttft_s) for r in rest),
        }

    before = [r for r in records if warmup_s <= r["sent_s"] < kill_s - GUARD_S]
    after = [r for r in records if ready_s is not None and r["sent_s"] >= ready_s]
    return {"before": part(before), "after_ready": part(after)}


def summarize(
    records: Sequence[Record],
    planned: int,
    events: Mapping[str, float | None],
    samples: Sequence[Mapping[str, Any]],
    victim: str,
) -> dict[str, Any]:
    """Everything the report shows about one system's run, from its records and events. Pure."""
    slo = SCENARIO.slo_ttft_s
    bins = timeline(records, end_s=DURATION_S, bin_s=BIN_S, slo_ttft_s=slo)
    kill_s, ready_s = float(events["kill_s"] or KILL_AT_S), events.get("ready_s")
    return {
        "accounting": account(records, planned),
        "dip": dip(bins, warmup_s=SCENARIO.warmup_s, kill_s=kill_s, ready_s=ready_s, bin_s=BIN_S),
        "router": router_view(samples, kill_s=kill_s, ready_s=ready_s),
        "served": served(records, victim, warmup_s=SCENARIO.warmup_s, kill_s=kill_s, ready_s=ready_s, slo_ttft_s=slo),
        "timeline": bins,
    }


# --- shell: processes and the run ---------------------------------------------------------------
def _victim_sample(page: str, victim: str) -> tuple[bool, float]:
    from lorapool_dev.testing.scrape import metric_value

    up = metric_value(page, "lorapool_router_backend_up", backend=victim)
    return up > 0, metric_value(page, "lorapool_router_backend_inflight", backend=victim)


def _counters(page: str) -> dict[str, float]:
    from lorapool_dev.testing.scrape import samples

    found = samples(page)
    out = {f"retries {labels.get('reason', '')}": v for labels, v in found.get("lorapool_router_retries_total", [])}
    out["upstream failures"] = sum(v for _, v in found.get("lorapool_router_upstream_failures_total", []))
    return out


async def _drive(
    url: str, victim: Component, restart: Callable[[], Component], scale: float
) -> tuple[RunResult, int, dict[str, float | None], list[dict[str, Any]], dict[str, float]]:
    from lorapool_dev.testing.scrape import scrape

    plan = [dataclasses.replace(p, at_s=p.at_s * scale) for p in schedule(SCENARIO.workload)]
    t0 = time.perf_counter()  # run_open_loop's own t0 is taken within a millisecond of this

    def now() -> float:
        return (time.perf_counter() - t0) / scale

    events: dict[str, float | None] = {"kill_s": None, "restart_s": None, "ready_s": None}
    watched: list[dict[str, Any]] = []

    async def chaos() -> None:
        await asyncio.sleep(max(0.0, KILL_AT_S - now()) * scale)
        victim.proc.popen.kill()  # SIGKILL: no goodbye to open connections
        events["kill_s"] = now()
        await asyncio.to_thread(victim.proc.popen.wait, 10)
        await asyncio.sleep(max(0.0, KILL_AT_S + OUTAGE_S - now()) * scale)
        events["restart_s"] = now()
        await asyncio.to_thread(restart)  # returns once /health answers
        events["ready_s"] = now()

    async def watch() -> None:
        while True:
            try:
                page = await asyncio.to_thread(scrape, url, 5.0)
                up, inflight = _victim_sample(page, victim.url)
                watched.append({"t_s": round(now(), 3), "up": up, "inflight": inflight, "load_1m": _load()})
            except OSError:
                pass
            await asyncio.sleep(WATCH_EVERY_S * scale)

    killer, watcher = asyncio.create_task(chaos()), asyncio.create_task(watch())
    result = await run_open_loop(url, plan, drain_timeout_s=DRAIN_S * scale)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    await killer
    counters = _counters(await asyncio.to_thread(scrape, url, 10.0))
    return result, len(plan), events, watched, counters


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_system(system: System, adapter_root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One system on fresh replicas: its summary and its per-request records."""
    spec, scale = SCENARIO.fleet, SCENARIO.fleet.time_scale
    adapters = write_adapters(adapter_root, spec.adapters)
    started, load_start = time.monotonic(), _load()
    with ExitStack() as stack, ThreadPoolExecutor(spec.replicas) as pool:
        futures = [pool.submit(start_replica, spec, i, adapters) for i in range(spec.replicas)]
        replicas = [stack.enter_context(f.result()) for f in futures]
        victim = replicas[VICTIM]

        def restart() -> Component:
            return stack.enter_context(start_replica(spec, VICTIM, adapters, port=victim.port))

        backends = [r.url for r in replicas]
        tagged = dataclasses.replace(system, args=(*system.args, "--backend-header"))  # who answered each request
        url = stack.enter_context(tagged.start(backends, max_cpu_loras=spec.max_cpu_loras, time_scale=scale))
        result, planned, events, watched, counters = asyncio.run(_drive(url, victim, restart, scale))
    records = [record(o, scale) for o in result.outcomes]
    summary = {
        "system": system.name,
        "victim": victim.url,
        "events": events,
        **summarize(records, planned, events, watched, victim.url),
        "router_counters": counters,
        "router_samples": watched,
        "loadavg_1m": {"start": load_start, "end": _load()},
        "late_sends": result.late_starts,  # sent > 5 ms (wall) behind the schedule: the machine fell behind
        "wall_s": round(time.monotonic() - started, 1),
    }
    return summary, records


def run(out: Path, adapter_root: Path, stamp: dict[str, str]) -> dict[str, Any]:
    """Measure every compared system; write chaos.json, chaos_requests.json and the plot."""
    runs, requests = [], {}
    for system in (s for s in SYSTEMS if s.name in COMPARED):
        try:
            summary, records = run_system(system, adapter_root)
        except Exception as exc:  # reported in the file, not fatal
            summary, records = {"system": system.name, "error": repr(exc)[:500]}, []
        runs.append(summary)
        requests[system.name] = records
        shown = {k: v for k, v in summary.items() if k not in ("timeline", "router_samples")}
        print(json.dumps(shown, default=str), flush=True)
    data = {
        **stamp,
        "scenario": {
            "name": SCENARIO.name,
            "about": SCENARIO.about,
            "fleet": dataclasses.asdict(SCENARIO.fleet),
            "workload": dataclasses.asdict(SCENARIO.workload),
            "warmup_s": SCENARIO.warmup_s,
            "slo_ttft_s": SCENARIO.slo_ttft_s,
        },
        "params": {
            "kill_at_s": KILL_AT_S,
            "outage_s": OUTAGE_S,
            "victim": VICTIM,
            "bin_s": BIN_S,
            "band": BAND,
            "guard_s": GUARD_S,
            "sustain_bins": SUSTAIN_BINS,
            "drain_s": DRAIN_S,
            "watch_every_s": WATCH_EVERY_S,
        },
        "runs": runs,
    }
    (out / RESULTS_FILE).write_text(json.dumps(data, indent=1, default=str))
    write_requests(out, requests)
    plot(out)
    return data


def write_requests(out: Path, requests: Mapping[str, Sequence[Record]]) -> None:
    """The records as rows under one list of field names, a line per request (a third of the size of dicts)."""
    fields = list(FIELDS)
    lines = [json.dumps({"fields": fields})[:-1] + ', "runs": {']
    for i, (system, records) in enumerate(requests.items()):
        rows = ",\n".join(json.dumps([r[f] for f in fields]) for r in records)
        lines.append(f"{json.dumps(system)}: [\n{rows}\n]{',' if i < len(requests) - 1 else ''}")
    (out / REQUESTS_FILE).write_text("\n".join([*lines, "}}"]) + "\n")


def load_requests(results_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The records ``write_requests`` wrote, as dicts again, by system."""
    data = json.loads((results_dir / REQUESTS_FILE).read_text())
    return {
        system: [dict(zip(data["fields"], row, strict=True)) for row in rows] for system, rows in data["runs"].items()
    }


# --- report ------------------------------------------------------------------------------------
def load(results_dir: Path) -> dict[str, Any] | None:
    path = results_dir / RESULTS_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _s(x: float | None, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f} s"


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f} %"


def _of(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.0f} %)" if total else f"{n}"


def section(data: Mapping[str, Any] | None, plots_dir: str = "results") -> list[str]:
    """RESULTS.md's chaos section from a chaos.json's content; nothing when it was never measured. Pure.

    Read by ``bench.report.render``: 1. what was run, 2. every request by how it ended, 3. the
    goodput dip and recovery, 4. the router's side, 5. the plot."""
    if not data:
        return []
    runs = [r for r in data["runs"] if "error" not in r]
    return [
        *_setup(data, runs),
        *_accounting_table(data),
        *_dip_table(data, runs),
        *_router_table(data["params"], runs),
        "",
        f"![{PLOT_FILE}]({plots_dir}/{PLOT_FILE})",
        "",
    ]


def _loads(runs: Sequence[Mapping[str, Any]]) -> str:
    """Each run's load average (1 min) at its start and end, its highest sample and its late sends."""
    return "; ".join(
        f"{r['system']} {r['loadavg_1m']['start']:.1f} to {r['loadavg_1m']['end']:.1f}"
        + (
            f", at most {m:.1f}"
            if (m := max((x.get("load_1m", 0.0) for x in r.get("router_samples", [])), default=0.0))
            else ""
        )
        + (f" ({r['late_sends']} requests sent > 5 ms late)" if "late_sends" in r else "")
        for r in runs
    )


def _setup(data: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The heading, the command and machine, and what the cell does (scenario, kill, restart)."""
    p, sc = data["params"], data["scenario"]
    scale = sc["fleet"]["time_scale"]
    return [
        "## Chaos: a replica killed and restarted (regime a)",
        "",
        f"`{data['command']}` on {data['date']} ({data['machine']}; load average (1 min) over each run: {_loads(runs)}).",
        f"Scenario {sc['about']}: {sc['workload']['duration_s']:g} s of arrivals, `--time-scale {scale:g}`"
        f" ({scale:g} wall seconds per simulated second; every time below is simulated). Replica {p['victim']}'s"
        f" `lorapool sim` process gets SIGKILL at {p['kill_at_s']:g} s (the bench runs no sidecar, so this is"
        f" what a pod crash kills) and the same command starts on the same port {p['outage_s']:g} s later, cold;"
        " the load generator keeps its open-loop schedule. Each system on fresh replicas, the same schedule.",
        "",
    ]


def _accounting_table(data: Mapping[str, Any]) -> list[str]:
    """Every request sent by how it ended, one row per system (a failed run shows its error)."""
    lines = [
        "Every request sent, by how it ended (a request with neither an answer nor an error within its"
        f" timeout, {data['params']['drain_s']:g} s after the last arrival at the least, or whose stream stopped without"
        " `[DONE]` or an error event, has vanished):",
        "",
        "| system | planned | sent | answered | errored | errors by kind | vanished |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        if "error" in r:
            lines.append(f"| {r['system']} | error: {r['error'][:120]} | | | | | |")
            continue
        a = r["accounting"]
        kinds = ", ".join(f"{k} {n}" for k, n in a["errors"].items()) or "none"
        gone = ", ".join(f"{k}: {n}" for k, n in a["vanished_kinds"].items())
        lines.append(
            f"| {r['system']} | {a['planned']} | {a['sent']} | {a['answered']} | {a['errored']} | {kinds}"
            f" | {a['vanished']}{f' ({gone})' if gone else ''} |"
        )
    return lines


def _dip_table(data: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """How goodput share, dip and recovery are read, then one row per system that ran."""
    p, sc = data["params"], data["scenario"]
    band = f"{100 * p['band']:.0f} %"
    lines = [
        "",
        f"Goodput share = requests answered within the {sc['slo_ttft_s']:g} s TTFT SLO / requests sent, per"
        f" {p['bin_s']:g} s bin of send time (over offered load, so the Poisson noise of arrivals drops out)."
        f" The dip window starts {p['guard_s']:g} s before the kill (a request lasts up to ~3 s here, so those"
        " sent then may still run on the victim when it dies); the pre-kill level is the share from the end of"
        f" the {sc['warmup_s']:g} s warm-up to that window. Band: within {band} of the level ({band} is above a"
        " healthy bin's noise, which the pre-kill bins outside it check, and well below the quarter of the"
        " fleet a kill removes). Dip: the worst bin of the window and its time outside the band. Recovered:"
        " the first bin, from the restarted replica's readiness (/health answering) on, after which every bin"
        f" to the end of the run is inside the band (at least {p['sustain_bins']} bins); recovery time = that"
        " minus the readiness time (0 when goodput was back first; '-' when it did not stay back within the run).",
        "",
        "| system | pre-kill goodput | pre-kill bins outside the band | worst bin | time outside the band"
        " | restarted, ready at | recovered at | recovery time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        d, e = r["dip"], r["events"]
        lines.append(
            f"| {r['system']} | {d['level_rps']:.1f} req/s ({_pct(d['level_share'])} of sent)"
            f" | {d['noise_bins']} of {d['pre_bins']} | {_pct(d['worst_share'])} of sent at {_s(d['worst_at_s'], 0)}"
            f" ({d['depth_pct']:.0f} % below the level) | {_s(d['below_s'], 0)}"
            f" | {_s(e['restart_s'])}, {_s(e['ready_s'])} | {_s(d['recovered_at_s'], 0)} | {_s(d['recovery_s'])} |"
        )
    return lines


def _router_table(p: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The router's view of the victim (rotation, retries, cut responses, its part of the requests)."""
    lines = [
        "",
        f"The router's side, from its /metrics (read every {p['watch_every_s']:g} s) and the `X-Lorapool-Backend`"
        " header of each answer: when the victim left rotation after the kill and came back after its"
        " readiness, the retries (another backend tried before the first byte, by reason) and the responses cut"
        " short (upstream failures); the victim's part of the requests sent before the dip window and after its"
        " readiness, with the good share of what it answered vs the other replicas'.",
        "",
        "| system | out of rotation after the kill | back after ready | retries | upstream failures"
        " | victim's part before | victim's part after ready | good share after ready: victim vs others |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        v, c, sv = r["router"], r["router_counters"], r["served"]
        b, a = sv["before"], sv["after_ready"]
        retries = ", ".join(f"{k.removeprefix('retries ')} {n:.0f}" for k, n in c.items() if k.startswith("retries "))
        share = f"{_pct(_ratio(a['victim_good'], a['victim']))} vs {_pct(_ratio(a['elsewhere_good'], a['elsewhere']))}"
        lines.append(
            f"| {r['system']} | {_s(v['down_after_kill_s'], 2)} | {_s(v['up_after_ready_s'], 2)}"
            f" | {retries or 'none'} | {c.get('upstream failures', 0):.0f} | {_of(b['victim'], b['sent'])}"
            f" | {_of(a['victim'], a['sent'])} | {share} |"
        )
    return lines


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def plot(results_dir: Path) -> None:
    """Goodput per second over the run, one panel per system, with the kill, restart and recovery marked."""
    data = load(results_dir)
    if not data:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in data["runs"] if "error" not in r]
    p = data["params"]
    fig, axes = plt.subplots(1, max(1, len(runs)), figsize=(6 * max(1, len(runs)), 3.8), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], runs, strict=False):
        bins, d, e = r["timeline"], r["dip"], r["events"]
        xs = [b["t_s"] + p["bin_s"] / 2 for b in bins]
        ax.plot(xs, [b["sent"] / p["bin_s"] for b in bins], color="grey", linewidth=1, label="sent")
        ax.plot(xs, [b["good"] / p["bin_s"] for b in bins], marker="o", markersize=3, label="goodput")
        errs = [(x, (b["errored"] + b["vanished"]) / p["bin_s"]) for x, b in zip(xs, bins, strict=True)]
        ax.bar([x for x, _ in errs], [y for _, y in errs], width=p["bin_s"] * 0.8, color="tab:red", alpha=0.6,
               label="errored + vanished")  # fmt: skip
        ax.axvline(e["kill_s"], color="black", linestyle="--", linewidth=1, label="kill")
        if e.get("ready_s") is not None:
            ax.axvspan(e["kill_s"], e["restart_s"], color="tab:red", alpha=0.08, label="replica down")
            ax.axvspan(e["restart_s"], e["ready_s"], color="orange", alpha=0.4, label="restarting")
        if d.get("recovered_at_s") is not None:
            ax.axvline(d["recovered_at_s"], color="green", linestyle=":", linewidth=1.5, label="recovered")
        ax.axvspan(0, data["scenario"]["warmup_s"], color="grey", alpha=0.1)
        ax.set_title(r["system"], fontsize=9)
        ax.set_xlabel("send time, simulated s")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("requests / simulated s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(results_dir / PLOT_FILE, dpi=110)
    plt.close(fig)
