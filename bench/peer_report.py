"""Issue 47: our picker beside the GIE endpoint picker (EPP), read out of results.json. Pure.

The peer comparison pairs, per scenario, our picker in that regime's best documented config
(``scenarios.OUR_PICKER``: fair dispatch in (f), the prefix scorer in (g), plain affinity elsewhere)
with each EPP config measured in the same file, by our load generator (``data["runs"]``) and by
inference-perf (``data["inference_perf"]["runs"]``, the field's load generator, the same cells
driven from outside). ``ratio_cells`` and ``overhead_cells`` are what the ``peer: `` targets read;
``section`` is RESULTS.md's table of the rows themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.formatting import fmt
from bench.results import across, runs_by_scenario
from bench.scenarios import (
    ENVOY_PICKER,
    EPP_LORA_WEIGHT,
    GIE_EPP_DEFAULT,
    GIE_EPP_LORA,
    GIE_EPPS,
    OUR_PICKER,
)

PEER_REGIMES = ("a", "b", "c", "d", "e", "f", "g")
OVERHEAD_RATES = ("100", "500")
INFERENCE_PERF = "inference-perf"
EPP_VERSION = "v1.5.0"
EPP_CONFIGS = {
    GIE_EPP_DEFAULT: "its built-in default: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3",
    GIE_EPP_LORA: f"the default plus lora-affinity-scorer {EPP_LORA_WEIGHT:g} (chosen by a sweep, bench/NOTES.md)",
}


def our_picker(regime: str) -> str:
    return OUR_PICKER.get(regime, ENVOY_PICKER)


def _ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan if a == b else (math.inf if not math.isfinite(a) else 0.0)
    return a / b if b > 0 else math.inf if a > 0 else math.nan


def _by_loadgen(data: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, dict[str, Any]]]]]:
    """(load generator, scenario -> system -> run) for ours and inference-perf's runs."""
    ours = runs_by_scenario(data)
    theirs = runs_by_scenario({"date": data.get("date"), "runs": (data.get("inference_perf") or {}).get("runs", [])})
    return [("", ours), (INFERENCE_PERF, theirs)]


def ratio_cells(key: str) -> Callable[[dict[str, Any]], list[tuple[str, float]]]:
    """Per scenario of (a)-(g), per EPP config and load generator: our picker's ``key`` over the EPP's."""

    def cells(data: dict[str, Any]) -> list[tuple[str, float]]:
        regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
        out = []
        for loadgen, by_scenario in _by_loadgen(data):
            for name, runs in by_scenario.items():
                regime = regimes.get(name.split("@")[0], "")
                ours = runs.get(our_picker(regime))
                if regime not in PEER_REGIMES or ours is None:
                    continue
                for epp in GIE_EPPS:
                    if epp in runs:
                        tail = f", {loadgen}" if loadgen else ""
                        label = f"{name} vs {epp}{tail}{across(ours, runs[epp])}"
                        out.append((label, _ratio(ours[key], runs[epp][key])))
        return out

    return cells


def overhead_cells(key: str) -> Callable[[dict[str, Any]], list[tuple[str, float]]]:
    """At 100 and 500 req/s: our picker's added ``key`` minus the EPP's (ms), from the peer's own
    overhead run (``data["peer_overhead"]``, both interleaved in one run) or else the overhead cell."""

    def cells(data: dict[str, Any]) -> list[tuple[str, float]]:
        rates = _overhead(data).get("rates") or {}
        out = []
        for rate in OVERHEAD_RATES:
            systems = rates.get(rate) or {}
            if ENVOY_PICKER in systems and GIE_EPP_LORA in systems:
                out.append((f"{rate} req/s", systems[ENVOY_PICKER][key] - systems[GIE_EPP_LORA][key]))
        return out

    return cells


def _overhead(data: dict[str, Any]) -> dict[str, Any]:
    peer = data.get("peer_overhead") or {}
    return peer if GIE_EPP_LORA in ((peer.get("rates") or {}).get("100") or {}) else data.get("overhead") or {}


def _overhead_lines(data: dict[str, Any]) -> list[str]:
    """The added latency of both pickers at each rate of the run that measured them side by side."""
    over = _overhead(data)
    rates = {r: s for r, s in (over.get("rates") or {}).items() if ENVOY_PICKER in s and GIE_EPP_LORA in s}
    if not rates:
        return []
    lines = [
        f"Added latency over direct (ms, medians of {over.get('repeats', '-')} interleaved repeats; one replica at"
        f" `--time-scale 0`, 1-token requests), measured {over.get('date', '-')} with `{over.get('command', '-')}`:",
        "",
        *([f"({over['note']})", ""] if over.get("note") else []),
        *(
            [
                f"The load generator fell behind its own schedule from {over['loadgen_limit_rps']:g} req/s on (direct's"
                " sends > 1 % late; the machine was shared): rows at and above it measure the machine as much as"
                " the pickers.",
                "",
            ]
            if over.get("loadgen_limit_rps") is not None
            else []
        ),
        "| rate (req/s) | system | added p50 | added p99 | errors |",
        "|---|---|---|---|---|",
    ]
    for rate, systems in sorted(rates.items(), key=lambda kv: float(kv[0])):
        for name in (ENVOY_PICKER, GIE_EPP_LORA):
            st = systems[name]
            lines.append(
                f"| {rate} | {name} | {fmt(st['added_p50_ms'])} | {fmt(st['added_p99_ms'])} | {st.get('errors', 0)} |"
            )
    return [*lines, ""]


def why_wins(data: dict[str, Any]) -> str:
    """Where the EPP wins a goodput cell: its adapter loads and p99 beside ours, from the same cells."""
    out = []
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    for name, runs in runs_by_scenario(data).items():
        ours = runs.get(our_picker(regimes.get(name, "")))
        for epp in GIE_EPPS:
            if ours is None or epp not in runs or runs[epp]["goodput_rps"] <= ours["goodput_rps"]:
                continue
            them = runs[epp]
            out.append(
                f"{name}: {epp} {them['goodput_rps']:.1f} req/s vs {ours['goodput_rps']:.1f}, adapter loads per 1k"
                f" {them['stalls_per_1k']:.0f} vs {ours['stalls_per_1k']:.0f}, p99 TTFT {fmt(them['ttft_p99_s'])} vs"
                f" {fmt(ours['ttft_p99_s'])} s"
            )
    return "; ".join(out) + (" (bench/NOTES.md, 'The GIE endpoint picker')" if out else "")


def _row(system: str, run: dict[str, Any], loadgen: str) -> str:
    return (
        f"| {system} | {loadgen or 'ours'} | {run['goodput_rps']:.1f} | {fmt(run['ttft_p50_s'])} |"
        f" {fmt(run['ttft_p99_s'])} | {run.get('stalls_per_1k', math.nan):.0f} | {run.get('failed', 0)} |"
        f" {run.get('date', '')} |"
    )


def section(data: dict[str, Any]) -> list[str]:
    """RESULTS.md's peer section: the EPP's version and configs, ours per regime, then the cells."""
    regimes = {s["name"]: s["regime"] for s in data.get("scenarios", [])}
    rows: list[str] = []
    for loadgen, by_scenario in _by_loadgen(data):
        for name, runs in by_scenario.items():
            ours = our_picker(regimes.get(name.split("@")[0], ""))
            shown = [s for s in (ours, *GIE_EPPS) if s in runs]
            if not any(s in runs for s in GIE_EPPS):
                continue
            rows += [f"| **{name}** | | | | | | | |"] + [_row(s, runs[s], loadgen) for s in shown]
    overhead = _overhead_lines(data)
    if not rows and not overhead:
        return []
    lines = ["## The GIE endpoint picker beside ours (issue 47)", ""]
    lines += [
        f"The Gateway API Inference Extension's endpoint picker {EPP_VERSION} (`cmd/epp`, built by"
        " `lorapool_dev/peer.py` from the Go module proxy) behind the same Envoy as our picker"
        " (FULL_DUPLEX_STREAMED, TLS, ORIGINAL_DST), on the same replicas, its pool an InferencePool v1 on"
        " a local kube-apiserver; its metrics refresh (50 ms) and staleness (2 s) stretched by the time scale."
        " Configs:",
        "",
        *(f"- `{name}`: {text}" for name, text in EPP_CONFIGS.items()),
        f"- ours: `{ENVOY_PICKER}` (affinity) in (a)-(d), "
        + ", ".join(f"`{s}` in ({r})" for r, s in OUR_PICKER.items()),
        "",
        "Load generator `ours` is bench/loadgen.py; `inference-perf` is kubernetes-sigs/inference-perf driving"
        " the same cell (`python bench/run.py --loadgen inference-perf`), its report files in"
        " bench/results/inference-perf/.",
        "",
        "| system | load generator | goodput (req/s) | p50 TTFT (s) | p99 TTFT (s) | adapter loads / 1k | failed"
        " | measured |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *overhead,
    ]
    return lines
