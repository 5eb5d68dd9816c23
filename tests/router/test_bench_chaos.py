"""The chaos cell's pure parts: how a request ended, the accounting, the goodput dip and recovery, the section."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the repo root holds bench/

from bench import chaos  # noqa: E402
from bench.targets import TARGETS  # noqa: E402

RESULTS = REPO / "bench" / "results"


def rec(sent_s: float = 0.0, status: int = 200, ttft_s: float | None = 0.1, **kw: Any) -> dict[str, Any]:
    """A request record as chaos.record writes it; by default answered within the SLO."""
    base = {
        "model": "lora-0000", "sent_s": sent_s, "status": status, "ttft_s": ttft_s, "done_s": sent_s + 1.0,
        "tokens": 16, "error": "", "retry_after": "", "sse_error": False, "finished": True, "backend": "b",
    }  # fmt: skip
    return {**base, **kw}


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        (rec(), chaos.ANSWERED),
        (rec(status=503, ttft_s=None, finished=False, error="no backend", retry_after="1"), chaos.REFUSED),
        (rec(status=503, ttft_s=None, finished=False, error="busy"), "HTTP 503"),
        (rec(status=502, ttft_s=None, finished=False, error="backend failed"), "HTTP 502"),
        (rec(finished=False, error="{'message': 'backend failed mid-stream'}", sse_error=True), chaos.SSE_ERROR),
        (rec(finished=False, error="ClientPayloadError(...)"), chaos.CONNECTION),
        (rec(status=0, ttft_s=None, finished=False, error="ServerDisconnectedError()"), chaos.CONNECTION),
        (rec(finished=False), chaos.TRUNCATED),
        (rec(ttft_s=None, done_s=None, finished=False, error="not finished within the drain timeout"), chaos.TIMED_OUT),
        (rec(ttft_s=0.2, done_s=None, finished=False), chaos.TIMED_OUT),
    ],
    ids=[
        "answered", "503 with Retry-After", "503 without", "502", "SSE error event", "broken mid-stream",
        "no connection", "stream ended silently", "drain timeout", "streaming at the deadline",
    ],
)  # fmt: skip
def test_kind_says_how_a_request_ended(record: dict[str, Any], kind: str) -> None:
    assert chaos.kind(record) == kind


def test_account_adds_up_and_catches_a_vanished_request() -> None:
    records = [
        rec(),
        rec(),
        rec(finished=False, error="x", sse_error=True),
        rec(status=503, ttft_s=None, finished=False, error="x", retry_after="1"),
        rec(ttft_s=None, done_s=None, finished=False, error="not finished within the drain timeout"),
    ]
    a = chaos.account(records, planned=5)
    assert (a["sent"], a["answered"], a["errored"], a["vanished"]) == (5, 2, 2, 1)
    assert a["errors"] == {chaos.REFUSED: 1, chaos.SSE_ERROR: 1}
    assert a["vanished_kinds"] == {chaos.TIMED_OUT: 1}
    assert a["sent"] == a["answered"] + a["errored"] + a["vanished"]
    assert chaos.account(records[:2], planned=2)["vanished"] == 0


def test_timeline_bins_by_send_time_and_counts_only_answers_within_the_slo_as_good() -> None:
    records = [
        rec(0.2),
        rec(0.7, ttft_s=0.6),  # answered, too slow
        rec(1.1, finished=False, error="x", sse_error=True),
        rec(1.5, ttft_s=None, done_s=None, finished=False),
        rec(2.9),  # the last bin takes what is sent at its end
    ]
    bins = chaos.timeline(records, end_s=2.0, bin_s=1.0, slo_ttft_s=0.5)
    assert bins == [
        {"t_s": 0.0, "sent": 2, "good": 1, "errored": 0, "vanished": 0},
        {"t_s": 1.0, "sent": 3, "good": 1, "errored": 1, "vanished": 1},
    ]


def bins_of(shares: list[float], sent: int = 100) -> list[dict[str, Any]]:
    return [{"t_s": float(i), "sent": sent, "good": round(s * sent), "errored": 0, "vanished": 0}
            for i, s in enumerate(shares)]  # fmt: skip


# 2 warm-up bins, 3 pre-kill bins at 0.9; the kill at 6 s, the dip window from 5 s (1 s guard).
PRE = [0.5, 0.5, 0.9, 0.9, 0.9]


@pytest.mark.parametrize(
    ("shares", "ready_s", "expect"),
    [
        # dips to 0.45 (50 % below 0.9) for 3 bins; back in the band from 9 s, ready at 8.5 -> 0.5 s
        ([*PRE, 0.9, 0.45, 0.6, 0.7, 0.85, 0.9, 0.9, 0.9], 8.5,
         {"worst_share": 0.45, "worst_at_s": 6.0, "depth_pct": 50.0, "below_s": 3.0, "recovered_at_s": 9.0,
          "recovery_s": 0.5}),
        # back before the replica was: recovery 0
        ([*PRE, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9], 8.2,
         {"below_s": 1.0, "recovered_at_s": 8.0, "recovery_s": 0.0}),
        # back for a moment, then out again: recovered only once it stays back
        ([*PRE, 0.5, 0.5, 0.5, 0.9, 0.5, 0.9, 0.9, 0.9], 7.0,
         {"below_s": 4.0, "recovered_at_s": 10.0, "recovery_s": 3.0}),
        ([*PRE, 0.5, 0.9, 0.9, 0.9, 0.5, 0.9, 0.9, 0.9], 6.0, {"recovered_at_s": 10.0, "recovery_s": 4.0}),
        # back only for the last two bins: too few to call it
        ([*PRE, 0.5, 0.5, 0.5, 0.5, 0.9, 0.9], 6.0, {"recovered_at_s": None, "recovery_s": None}),
        # never back within the run
        ([*PRE, 0.5, 0.5, 0.5, 0.5, 0.5], 7.0, {"recovered_at_s": None, "recovery_s": None}),
        # the replica never came back
        ([*PRE, 0.9, 0.9, 0.9], None, {"below_s": 0.0, "recovered_at_s": None, "recovery_s": None}),
        # requests sent within the guard before the kill fail with it: the dip, not the level
        ([*PRE, 0.3, 0.9, 0.9, 0.9], 6.5, {"worst_at_s": 5.0, "below_s": 1.0, "recovered_at_s": 6.0}),
    ],
    ids=["dip and recovery", "back before ready", "sustained", "out again", "too few bins", "never recovered",
         "never ready", "guard"],
)  # fmt: skip
def test_dip_and_recovery(shares: list[float], ready_s: float | None, expect: dict[str, Any]) -> None:
    got = chaos.dip(
        bins_of(shares), warmup_s=2.0, kill_s=6.0, ready_s=ready_s, bin_s=1.0, guard_s=1.0, band=0.1, sustain=3
    )
    assert got["level_share"] == pytest.approx(0.9) and got["pre_bins"] == 3 and got["noise_bins"] == 0
    assert got["dip_from_s"] == 5.0
    assert {k: got[k] for k in expect} == pytest.approx(expect)


def test_router_view_reads_when_the_victim_left_and_rejoined_rotation() -> None:
    samples = [
        {"t_s": 9.8, "up": True, "inflight": 5.0}, {"t_s": 10.05, "up": True, "inflight": 5.0},
        {"t_s": 10.3, "up": False, "inflight": 0.0}, {"t_s": 15.5, "up": False, "inflight": 0.0},
        {"t_s": 16.2, "up": True, "inflight": 1.0},
    ]  # fmt: skip
    view = chaos.router_view(samples, kill_s=10.0, ready_s=15.2)
    assert view["down_after_kill_s"] == pytest.approx(0.3)
    assert view["up_after_ready_s"] == pytest.approx(1.0)


def test_section_shows_the_accounting_and_nothing_without_a_cell() -> None:
    assert chaos.section(None) == [] and chaos.section({}) == []
    records = [rec(float(i) / 4) for i in range(120)] + [rec(20.0, ttft_s=None, done_s=None, finished=False)]
    events = {"kill_s": 10.0, "restart_s": 15.0, "ready_s": 15.3}
    summary = chaos.summarize(records, 121, events, [], "b")
    run = {"system": "lorapool affinity", "events": events, "router_counters": {"retries connect": 2.0},
           "loadavg_1m": {"start": 1.0, "end": 2.0}, "late_sends": 3, **summary}  # fmt: skip
    data = {
        "command": "python bench/run.py --chaos", "date": "2026-12-03 01:00 UTC", "machine": "m",
        "scenario": {"about": "a", "fleet": {"time_scale": 4.0}, "workload": {"duration_s": 30.0},
                     "warmup_s": 2.5, "slo_ttft_s": 0.5},
        "params": {"victim": 0, "kill_at_s": 10.0, "outage_s": 5.0, "drain_s": 20.0, "bin_s": 1.0, "band": 0.1,
                   "guard_s": 3.0, "sustain_bins": 3, "watch_every_s": 0.25},
        "runs": [run, {"system": "lorapool round-robin", "error": "RuntimeError('boom')"}],
    }  # fmt: skip
    text = "\n".join(chaos.section(data, "results"))
    assert "| lorapool affinity | 121 | 121 | 120 | 0 | none | 1 (no answer or error within its timeout: 1) |" in text
    assert "| lorapool round-robin | error: RuntimeError('boom') |" in text
    assert "| connect 2 |" in text and "![chaos.png](results/chaos.png)" in text
    assert "lorapool affinity 1.0 to 2.0 (3 requests sent > 5 ms late)" in text
    target = next(t for t in TARGETS if t.what.startswith("chaos"))
    assert target.verdict({"chaos": data})[1] == "missed"
    run["accounting"] = {**run["accounting"], "vanished": 0}
    assert target.verdict({"chaos": data})[1] == "met"
    assert target.verdict({})[1] == "not measured"


def test_records_survive_their_file(tmp_path: Path) -> None:
    requests = {"a": [rec(0.5), rec(1.0, status=503, retry_after="1")], "b": [rec(2.0, done_s=None)], "c": []}
    chaos.write_requests(tmp_path, requests)
    assert chaos.load_requests(tmp_path) == requests
    assert set(rec()) == set(chaos.FIELDS)


def test_the_committed_cell_is_computed_from_its_committed_records() -> None:
    data = chaos.load(RESULTS)
    assert data is not None, "bench/results/chaos.json is missing: run `python bench/run.py --chaos`"
    requests = chaos.load_requests(RESULTS)
    for run in data["runs"]:
        if "error" in run:
            continue
        fresh = chaos.summarize(requests[run["system"]], run["accounting"]["planned"], run["events"],
                                run["router_samples"], run["victim"])  # fmt: skip
        assert json.loads(json.dumps(fresh)) == {k: run[k] for k in fresh}, run["system"]
