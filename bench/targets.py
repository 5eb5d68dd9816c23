"""The benchmark's targets: each a small record with its threshold; verdicts come from results.json.

A target names the issue that set it, what is measured, the bound and which side of it passes.
``cells`` reads the measured values out of a results.json (one per scenario, rate, ...); the
verdict is "met" when every cell is on the right side, "missed" when one is not and "not
measured" when results.json has no cell for it. Nothing here is written by hand after a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from bench import fairness_report as fair
from bench import h_report as h
from bench import large_catalog_report
from bench import peer_report as peer
from bench import prefix_report as prefix
from bench.results import across, runs_by_scenario
from bench.scenarios import (
    ENVOY_ALONE,
    ENVOY_NOOP,
    ENVOY_PICKER,
    LORAPOOL_ROUND_ROBIN,
    NOT_BASELINES,
    ORACLE,
)
from bench.scenarios import LORAPOOL_AFFINITY as AFFINITY

NGINX = "nginx round-robin"
VLLM_ROUTER = "vllm-router round_robin"
OVERHEAD_RATE = "500"
CAPACITY_ADDED_P99_MS = 5.0


@dataclass(frozen=True)
class Cell:
    """One measured value; ``limit`` overrides the target's bound for this cell (e.g. nginx + 0.5 ms)."""

    label: str
    value: float
    limit: float | None = None


@dataclass(frozen=True)
class Target:
    issue: str
    what: str
    bound: str  # the threshold as the report prints it
    limit: float
    better: Literal["higher", "lower"]
    unit: str
    cells: Callable[[dict[str, Any]], list[Cell]]
    why: Callable[[dict[str, Any]], str] | None = None  # the measured cause, from the same results, when missed
    unmeasured: str = "not measured"  # the verdict with no cell ("not measured yet": nothing can measure it today)

    def passes(self, cell: Cell) -> bool:
        limit = self.limit if cell.limit is None else cell.limit
        if math.isnan(cell.value):
            return False
        return cell.value >= limit if self.better == "higher" else cell.value <= limit

    def verdict(self, data: dict[str, Any]) -> tuple[list[Cell], str]:
        cells = self.cells(data)
        if not cells:
            return cells, self.unmeasured
        return cells, "met" if all(self.passes(c) for c in cells) else "missed"


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf if a > 0 else math.nan


def _vs_rr(key: str, regime: str, invert: bool) -> Callable[[dict[str, Any]], list[Cell]]:
    def cells(data: dict[str, Any]) -> list[Cell]:
        regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
        out = []
        for name, runs in runs_by_scenario(data).items():
            aff, rr = runs.get(AFFINITY), runs.get(LORAPOOL_ROUND_ROBIN)
            if regimes.get(name) != regime or not aff or not rr:
                continue
            value = _ratio(rr[key], aff[key]) if invert else _ratio(aff[key], rr[key])
            out.append(Cell(name + across(aff, rr), value))
        return out

    return cells


def _baselines(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in runs.items() if k not in NOT_BASELINES}


def _vs_best_other(key: str) -> Callable[[dict[str, Any]], list[Cell]]:
    """Affinity over the best baseline of each scenario (highest goodput, lowest p99)."""

    def cells(data: dict[str, Any]) -> list[Cell]:
        out = []
        for name, runs in runs_by_scenario(data).items():
            others = _baselines(runs)
            if AFFINITY not in runs or not others:
                continue
            pick = max if key == "goodput_rps" else min
            best = pick(others, key=lambda k: others[k][key])
            label = f"{name} vs {best}{across(runs[AFFINITY], others[best])}"
            out.append(Cell(label, _ratio(runs[AFFINITY][key], others[best][key])))
        return out

    return cells


def _regime_c_p99(data: dict[str, Any]) -> list[Cell]:
    out = []
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    for name, runs in runs_by_scenario(data).items():
        rrs = [runs[k] for k in (LORAPOOL_ROUND_ROBIN, NGINX, VLLM_ROUTER) if k in runs]
        if regimes.get(name) != "c" or AFFINITY not in runs or not rrs:
            continue
        best = min(rrs, key=lambda r: r["ttft_p99_s"])
        label = f"{name} vs {best['system']}{across(runs[AFFINITY], best)}"
        out.append(Cell(label, _ratio(runs[AFFINITY]["ttft_p99_s"], best["ttft_p99_s"])))
    return out


def _oracle_fraction(key: str) -> Callable[[dict[str, Any]], list[Cell]]:
    def cells(data: dict[str, Any]) -> list[Cell]:
        out = []
        for name, runs in runs_by_scenario(data).items():
            if AFFINITY in runs and ORACLE in runs:
                label = name + across(runs[AFFINITY], runs[ORACLE])
                out.append(Cell(label, _ratio(runs[AFFINITY][key], runs[ORACLE][key])))
        return out

    return cells


def _added_p99(data: dict[str, Any]) -> list[Cell]:
    systems = ((data.get("overhead") or {}).get("rates") or {}).get(OVERHEAD_RATE) or {}
    if AFFINITY not in systems:
        return []
    nginx = systems.get(NGINX, {}).get("added_p99_ms")
    limit = max(1.0, nginx + 0.5) if nginx is not None else 1.0
    return [Cell(f"{OVERHEAD_RATE} req/s", systems[AFFINITY]["added_p99_ms"], limit)]


def _first_chunk(data: dict[str, Any]) -> list[Cell]:
    relay = (data.get("overhead") or {}).get("relay") or {}
    return [Cell("streamed, real-time replica", relay["added_p99_ms"])] if "added_p99_ms" in relay else []


def capacity(systems_by_rate: dict[str, dict[str, Any]], system: str) -> float | None:
    """The highest rate at which ``system``'s median added p99 stays within the bound, and every lower one too."""
    best: float | None = None
    for rate in sorted(systems_by_rate, key=float):
        stats = systems_by_rate[rate].get(system)
        if stats is None:
            continue
        if stats["added_p99_ms"] > CAPACITY_ADDED_P99_MS or stats.get("errors", 0):
            break
        best = float(rate)
    return best


def _capacity(data: dict[str, Any]) -> list[Cell]:
    rates = (data.get("overhead") or {}).get("rates") or {}
    if len(rates) < 3 or not any(AFFINITY in s for s in rates.values()):
        return []  # two rates are not a curve
    found = capacity(rates, AFFINITY)
    return [Cell("lorapool affinity", found if found is not None else 0.0)]


def _picker_goodput(data: dict[str, Any]) -> list[Cell]:
    """Issue 24, per scenario of (a)-(g): the endpoint picker behind Envoy against the HTTP router, same policy."""
    out = []
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    for name, runs in runs_by_scenario(data).items():
        if AFFINITY in runs and ENVOY_PICKER in runs and regimes.get(name) != "h":
            label = name + across(runs[ENVOY_PICKER], runs[AFFINITY])
            out.append(Cell(label, _ratio(runs[ENVOY_PICKER]["goodput_rps"], runs[AFFINITY]["goodput_rps"])))
    return out


def _picker_p50_vs_nginx(data: dict[str, Any]) -> list[Cell]:
    """Issue 24: the picker's added p50 minus nginx's, at each overhead rate and to the first streamed chunk."""
    overhead = data.get("overhead") or {}
    out = []
    cells = [(f"{rate} req/s", systems) for rate, systems in (overhead.get("rates") or {}).items()]
    cells.append(("first streamed chunk", overhead.get("relay") or {}))
    for label, systems in cells:
        if ENVOY_PICKER in systems and NGINX in systems:
            out.append(Cell(label, systems[ENVOY_PICKER]["added_p50_ms"] - systems[NGINX]["added_p50_ms"]))
    return out


def _picker_added_p99(data: dict[str, Any]) -> list[Cell]:
    systems = ((data.get("overhead") or {}).get("rates") or {}).get(OVERHEAD_RATE) or {}
    if ENVOY_PICKER not in systems:
        return []
    nginx = systems.get(NGINX, {}).get("added_p99_ms")
    limit = max(1.0, nginx + 0.5) if nginx is not None else 1.0
    return [Cell(f"{OVERHEAD_RATE} req/s", systems[ENVOY_PICKER]["added_p99_ms"], limit)]


def _picker_capacity(data: dict[str, Any]) -> list[Cell]:
    """Measured only when the load generator kept its schedule up to 1,000 req/s; else not measurable yet."""
    overhead = data.get("overhead") or {}
    rates = overhead.get("rates") or {}
    limit = overhead.get("loadgen_limit_rps")
    if (limit is not None and limit <= 1000.0) or not any(ENVOY_PICKER in s for s in rates.values()):
        return []
    found = capacity(rates, ENVOY_PICKER)
    return [Cell(ENVOY_PICKER, found if found is not None else 0.0)]


def _chaos_vanished(data: dict[str, Any]) -> list[Cell]:
    """Per system of the chaos cell (bench/chaos.py, read into ``data["chaos"]``): requests that vanished."""
    runs = (data.get("chaos") or {}).get("runs", [])
    return [Cell(r["system"], float(r["accounting"]["vanished"])) for r in runs if "accounting" in r]


def _sizing_tuned(data: dict[str, Any]) -> list[Cell]:
    """Per workload of the sizing cell (bench/sizing.py, read into ``data["sizing"]``): tuned goodput / the sweep's best."""
    from bench.sizing import tuned_share

    return [Cell(c["workload"]["name"], tuned_share(c)) for c in (data.get("sizing") or {}).get("workloads", [])]


def _placement_vs_affinity(key: str) -> Callable[[dict[str, Any]], list[Cell]]:
    """Regime (e): lorapool placement against all-replica affinity (``large_catalog_report.versus_affinity``)."""

    def cells(data: dict[str, Any]) -> list[Cell]:
        out = []
        for name, runs in large_catalog_report.regime_e(data).items():
            ratios = large_catalog_report.versus_affinity(runs)
            if ratios is not None:
                out.append(Cell(name, ratios[key]))
        return out

    return cells


def _convergence(data: dict[str, Any]) -> list[Cell]:
    """Regime (e): seconds after the shift until the new hot adapter is on its k replicas (inf: never)."""
    out = []
    for name, runs in large_catalog_report.regime_e(data).items():
        run = runs.get(large_catalog_report.PLACEMENT)
        if run is not None:
            reached = run.get("convergence_s")
            label = f"{name}, {run['hot_after']} to k {run.get('hot_after_k')}"
            out.append(Cell(label, math.inf if reached is None else float(reached)))
    return out


def _loads(run: dict[str, Any]) -> str:
    return f"{run['disk_loads_per_1k']:.0f}"


def _p99(run: dict[str, Any]) -> str:
    value = run["ttft_p99_s"]
    return f"{value:.2f} s" if math.isfinite(value) else "none: requests left unfinished"


def _why_best_other(data: dict[str, Any]) -> str:
    """Where affinity loses goodput to a baseline: the baseline's fewer disk loads, paid for in p99 TTFT."""
    out = []
    for cell in _vs_best_other("goodput_rps")(data):
        name, best = cell.label.split(" vs ")[0], cell.label.split(" vs ")[1].split(" [")[0]
        runs = runs_by_scenario(data)[name]
        if cell.value < 0.95:
            aff, other = runs[AFFINITY], runs[best]
            out.append(
                f"{name}: {best} loads from disk for {_loads(other)} of 1,000 requests, affinity for {_loads(aff)},"
                f" and pays for it in p99 TTFT ({_p99(other)} vs affinity's {_p99(aff)})"
            )
    return "; ".join(out)


def _why_regime_c(data: dict[str, Any]) -> str:
    """Regime (c): every system loads nearly every request; holding for a slot only adds wait."""
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    out = []
    for name, runs in runs_by_scenario(data).items():
        if regimes.get(name) != "c" or AFFINITY not in runs:
            continue
        loads = [r["disk_loads_per_1k"] for k, r in runs.items() if k != ORACLE]
        text = (
            f"{name}: every system loads from disk for {min(loads):.0f}-{max(loads):.0f} of 1,000 requests (the"
            " oracle 0): no adapter is resident anywhere, so affinity's holding a request for a slot adds wait and"
            " saves no load"
        )
        other = runs.get(f"{AFFINITY} (hold-if-active)")
        if other is not None:
            aff = runs[AFFINITY]
            text += (
                f"; the rule that skips the hold for adapters active nowhere (hold-if-active) was measured too:"
                f" goodput {other['goodput_rps']:.1f} vs {aff['goodput_rps']:.1f} req/s, p99 TTFT"
                f" {other['ttft_p99_s']:.2f} vs {aff['ttft_p99_s']:.2f} s (a request pushed onto a full replica"
                " waits for that replica's slots only), so it is not the default"
            )
        out.append(text)
    return "; ".join(out)


def _why_first_chunk(data: dict[str, Any]) -> str:
    """The relay's p99 is a few requests of each repeat; its p50 is the proxy's own cost."""
    relay = (data.get("overhead") or {}).get("relay") or {}
    if "added_p99_ms_runs" not in relay or AFFINITY not in relay:
        return ""
    per_repeat = relay[AFFINITY]["n"] / max(1, len(relay["added_p99_ms_runs"]))
    runs = ", ".join(f"{v:.1f}" for v in relay["added_p99_ms_runs"])
    nginx = relay.get(NGINX, {}).get("added_p50_ms")
    text = (
        f"each repeat streams {per_repeat:.0f} requests, so its p99 is its 2-3 slowest (added p99 per repeat:"
        f" {runs} ms); the steady cost is the added p50, {relay['added_p50_ms']:.1f} ms"
    )
    if nginx is not None:
        text += f" (nginx: {nginx:.1f} ms)"
    return text + (
        ": aiohttp's HTTP server and client and the two loopback sends are over 90 % of the router's CPU per"
        " request, lorapool's own code under 10 % (profile in bench/NOTES.md)"
    )


def _picker_split(systems: dict[str, Any], key: str) -> str:
    """The picker's added latency split into Envoy's own, the ext_proc round trips' and the policy's."""
    have = [n for n in (ENVOY_ALONE, ENVOY_NOOP, ENVOY_PICKER) if key in systems.get(n, {})]
    if len(have) < 3:
        return ""
    alone, noop, picker = (systems[n][key] for n in (ENVOY_ALONE, ENVOY_NOOP, ENVOY_PICKER))
    return (
        f"Envoy alone adds {alone:.1f} ms, Envoy asking a policy-free Python ext_proc server {noop:.1f} ms, the"
        f" picker {picker:.1f} ms: the gRPC round trips cost {noop - alone:.1f} ms, lorapool's policy"
        f" {picker - noop:.1f} ms"
    )


def _why_picker(key: str, rates: tuple[str, ...]) -> Callable[[dict[str, Any]], str]:
    """Per overhead rate (and the first chunk for p50): where the picker's added ``key`` goes."""

    def why(data: dict[str, Any]) -> str:
        overhead = data.get("overhead") or {}
        cells = [(f"{r} req/s", (overhead.get("rates") or {}).get(r) or {}) for r in rates]
        if key == "added_p50_ms":
            cells.append(("first streamed chunk", overhead.get("relay") or {}))
        parts = [f"{label}: {text}" for label, systems in cells if (text := _picker_split(systems, key))]
        if not parts:
            return ""
        return "; ".join(parts) + (
            " (each request is 4-5 ext_proc messages, each a gRPC round trip Envoy waits for; a policy-free"
            " server in the same Python gRPC costs about as much, so the floor is the protocol in Python)"
        )

    return why


def _why_oracle(data: dict[str, Any]) -> str:
    """Below the oracle: the disk loads affinity still pays, which the oracle never does."""
    out = []
    for cell in _oracle_fraction("goodput_rps")(data):
        name = cell.label.split(" [")[0]
        runs = runs_by_scenario(data)[name]
        if cell.value < 0.93:
            aff = runs[AFFINITY]
            out.append(
                f"{name} {cell.value:.2f}: affinity waits on {aff['stalls_per_1k']:.0f} adapter loads per 1,000"
                f" requests ({_loads(aff)} of them from disk)"
            )
    return ("; ".join(out) + "; the oracle never loads (every adapter always resident)") if out else ""


def _cells(read: Callable[[dict[str, Any]], list[tuple[str, float]]]) -> Callable[[dict[str, Any]], list[Cell]]:
    """A module's (label, value) pairs as cells."""
    return lambda data: [Cell(label, value) for label, value in read(data)]


TARGETS: tuple[Target, ...] = (
    Target("grouping router", "regime (a): affinity's goodput over round-robin's", ">= 1.5x", 1.5, "higher", "x",
           _vs_rr("goodput_rps", "a", invert=False)),
    Target("grouping router", "regime (a): round-robin's p99 TTFT over affinity's", ">= 2x", 2.0, "higher", "x",
           _vs_rr("ttft_p99_s", "a", invert=True)),
    Target("grouping router", "every scenario: affinity's goodput over the best baseline's", ">= 0.95x", 0.95,
           "higher", "x", _vs_best_other("goodput_rps"), _why_best_other),
    Target("grouping router", "every scenario: affinity's p99 TTFT over the best baseline's", "<= 1.05x", 1.05,
           "lower", "x", _vs_best_other("ttft_p99_s")),
    Target("12", "regime (c): affinity's p99 TTFT over the best round-robin's", "<= 1.05x", 1.05, "lower", "x",
           _regime_c_p99, _why_regime_c),
    Target("12", "router overhead: added p99 latency at 500 req/s", "<= 1 ms or <= nginx's + 0.5 ms", 1.0,
           "lower", " ms", _added_p99),
    Target("12", "added p99 to the first streamed chunk", "<= 1 ms", 1.0, "lower", " ms", _first_chunk,
           _why_first_chunk),
    Target("12", "capacity: highest rate with added p99 <= 5 ms (ours: at least the overhead target's 500 req/s)",
           ">= 500 req/s", 500.0, "higher", " req/s", _capacity),
    Target("12", "affinity's goodput as a fraction of the oracle's (the literature's best: within 7 %)", ">= 0.93",
           0.93, "higher", "", _oracle_fraction("goodput_rps"), _why_oracle),
    Target("13", "chaos, regime (a), a replica killed and restarted: requests with neither an answer nor an error",
           "= 0", 0.0, "lower", " requests", _chaos_vanished),
    Target("15", "sizing: tuned --max-loras' goodput as a fraction of the best of a max-loras sweep", ">= 0.9",
           0.9, "higher", "", _sizing_tuned),
    Target("11", "regime (e): lorapool placement's goodput over all-replica affinity's", ">= 2x", 2.0, "higher",
           "x", _placement_vs_affinity("goodput")),
    Target("11", "regime (e): all-replica affinity's disk loads per 1k requests over placement's", ">= 2x", 2.0,
           "higher", "x", _placement_vs_affinity("fewer_disk_loads")),
    Target("11", "regime (e): placement's p99 TTFT over all-replica affinity's", "<= 1x", 1.0, "lower", "x",
           _placement_vs_affinity("p99")),
    Target("11", "regime (e): simulated seconds from the popularity shift until the new hot adapter is on its new k"
           " replicas", "<= 30 s", 30.0, "lower", " s", _convergence),
    Target("24", "every scenario: envoy + lorapool picker's goodput over lorapool affinity's", ">= 0.95x", 0.95,
           "higher", "x", _picker_goodput),
    Target("24", "envoy + lorapool picker's added p50 minus nginx's (overhead rates, first streamed chunk)",
           "<= 0.5 ms", 0.5, "lower", " ms", _picker_p50_vs_nginx, _why_picker("added_p50_ms", ("100", "500"))),
    Target("24", "envoy + lorapool picker: added p99 latency at 500 req/s", "<= 1 ms or <= nginx's + 0.5 ms", 1.0,
           "lower", " ms", _picker_added_p99, _why_picker("added_p99_ms", (OVERHEAD_RATE,))),
    Target("24", "envoy + lorapool picker's capacity (added p99 <= 5 ms; only with a load generator that keeps"
           " 1,000 req/s)", ">= 500 req/s", 500.0, "higher", " req/s", _picker_capacity,
           _why_picker("added_p99_ms", ("100", OVERHEAD_RATE))),
    Target("27", "regime (f): every well-behaved adapter's p99 TTFT under the flood over its own without it"
           " (lorapool fair)", "<= 1.2x", 1.2, "lower", "x", _cells(fair.p99_cells(fair.LORAPOOL_FAIR)),
           fair.why_p99),
    Target("27", "regime (f): the flood adapter's throughput over its max-min fair share of what the pool served"
           " (lorapool fair)", ">= 1x", 1.0, "higher", "x", _cells(fair.flood_share)),
    Target("27", "regime (f): lorapool fair's goodput over lorapool affinity's under the flood (work conservation)",
           ">= 0.95x", 0.95, "higher", "x", _cells(fair.goodput_vs_affinity)),
    Target("27", "regime (f): the critical adapter's requests within its 0.5 s TTFT SLO under the flood"
           " (lorapool fair)", ">= 0.99", 0.99, "higher", "", _cells(fair.critical_within_slo)),
    Target("27", "regime (f): regime (b)'s goodput as a fraction of the oracle's, lorapool fair's over lorapool"
           " affinity's (must not get worse)", ">= 0.97x", 0.97, "higher", "x", _cells(fair.oracle_gap)),
    # "No worse" allows the 3 % a cell moves between identical runs (regime (b)'s target above too).
    Target("28", "regime (g): lorapool affinity's p50 TTFT over lorapool affinity + prefix's", ">= 1.5x", 1.5,
           "higher", "x", _cells(prefix.p50_speedup), prefix.why_p50),
    Target("28", "regime (g): lorapool affinity + prefix's goodput over lorapool affinity's (no worse)", ">= 0.97x",
           0.97, "higher", "x", _cells(prefix.goodput_ratio)),
    Target("28", "regime (g): lorapool affinity + prefix's adapter loads per 1k requests over lorapool affinity's"
           " (no worse)", "<= 1.03x", 1.03, "lower", "x", _cells(prefix.loads_ratio)),
    # Issue 47: our picker (each regime's best documented config) against the GIE endpoint picker, per cell
    # and EPP config, by our load generator and by inference-perf (bench/peer_report.py).
    Target("47", "peer: every cell of (a)-(g): our picker's goodput over the GIE EPP's", ">= 0.97x", 0.97,
           "higher", "x", _cells(peer.ratio_cells("goodput_rps")), peer.why_wins),
    Target("47", "peer: every cell of (a)-(g): our picker's p99 TTFT over the GIE EPP's", "<= 1.05x", 1.05,
           "lower", "x", _cells(peer.ratio_cells("ttft_p99_s"))),
    Target("47", "peer: our picker's added p50 minus the GIE EPP's at 100 and 500 req/s (one run)", "<= 0 ms", 0.0,
           "lower", " ms", _cells(peer.overhead_cells("added_p50_ms"))),
    Target("47", "peer: our picker's added p99 minus the GIE EPP's at 100 and 500 req/s (one run)", "<= 0 ms", 0.0,
           "lower", " ms", _cells(peer.overhead_cells("added_p99_ms"))),
    # Issue 43, item 5: several routers must decide as one: 3 sharing their books against one (bench/h_report.py;
    # 3 with their own books are the "before" in RESULTS.md and bench/NOTES.md, regime (h)).
    Target("43", "regime (h): 3 routers' goodput over one router's, per cell and door", ">= 0.95x", 0.95, "higher",
           "x", _cells(h.ratio_cells("goodput_rps")), h.why_ratio),
    Target("43", "regime (h): 3 routers' p99 TTFT over one router's, per cell and door", "<= 1.2x", 1.2, "lower",
           "x", _cells(h.ratio_cells("ttft_p99_s"))),
    Target("43", "regime (h): 3 routers' adapter loads per 1k requests over one router's, per cell and door",
           "<= 1.1x", 1.1, "lower", "x", _cells(h.ratio_cells("stalls_per_1k"))),
    Target("43", "regime (h): a pool rate limit with 3 routers behind an L4 front, 1 and 100 client connections:"
           " admitted / limit, off 1 by", "<= 0.05", 0.05, "lower", "", _cells(h.rate_cells), h.why_rate),
    Target("43", "regime (h): regime (f) with 3 routers: the worst well-behaved adapter's p99 TTFT over one"
           " router's", "<= 1.1x", 1.1, "lower", "x", _cells(h.flood_cells)),
    Target("43", "regime (h): shared books' added p50 at 500 req/s (the overhead cell, store on 127.0.0.1)",
           "<= 0.5 ms", 0.5, "lower", " ms", _cells(h.overhead_cells), h.why_overhead),
)  # fmt: skip
