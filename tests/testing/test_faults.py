"""The fault harness's pure part (lorapool_dev.testing.faults): selection, verdicts, the report."""

from __future__ import annotations

import pytest

from lorapool_dev.testing import faults
from lorapool_dev.testing.faults import BY_NAME, Outcome, Sample

ROLL, KILL, ROUTER = BY_NAME["flag-roll"], BY_NAME["engine-kill"], BY_NAME["router-kill"]


def s(at: float, engines: int = 2, *, ready: bool = True, available: bool = True, loaded: int = 2) -> Sample:
    return Sample(at, engines, 2, 2, 2, ready, available, (loaded, loaded), 2)


def test_the_ci_set_is_the_default_all_is_every_fault_and_names_pick_in_table_order() -> None:
    assert [f.name for f in faults.selected(None)] == ["engine-kill", "flag-roll", "router-kill"]
    assert faults.selected("") == faults.selected("  ") == faults.selected(None)
    assert faults.selected("all") == list(faults.FAULTS) and len(faults.FAULTS) == 8
    assert [f.name for f in faults.selected("router-kill, evict")] == ["evict", "router-kill"]


def test_an_unknown_fault_name_is_an_error_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"LORAPOOL_FAULTS: unknown fault oom; use all or some of: engine-kill"):
        faults.selected("engine-kill,oom")


def test_a_request_without_an_answer_or_a_clean_error_fails_the_fault() -> None:
    outcomes = [Outcome(0, 0.1, 200), Outcome(1, 0.1, 500), Outcome(2, 0.0, None, faults.REFUSED)]
    samples = [s(0), s(1, 1, loaded=1), s(2)]
    clean = faults.judge(KILL, outcomes, samples, {"connect": 1})
    assert (clean.requests, clean.answered, clean.unclean, clean.problems) == (3, 1, 0, ())
    assert clean.errors == {"500": 1, "refused": 1} and clean.recovered_s == 2
    hung = faults.judge(KILL, [*outcomes, Outcome(3, 75, None, faults.HUNG)], samples, {})
    assert hung.unclean == 1 and hung.problems == ("1 requests had neither an answer nor a clean error",)


def test_resets_are_allowed_only_where_a_sigkilled_router_held_the_requests() -> None:
    reset = [Outcome(0, 0.2, None, faults.RESET)]
    assert faults.judge(ROUTER, reset, [s(0)], {}).problems == ()
    assert faults.judge(KILL, reset, [s(0)], {}).problems == ("1 requests had neither an answer nor a clean error",)
    assert faults.judge(ROUTER, [*reset, Outcome(1, 75, None, faults.HUNG)], [s(0)], {}).unclean == 2


def test_recovery_is_the_first_full_sample_after_the_last_short_one() -> None:
    assert faults.recovered_at([s(0), s(1, 1), s(2), s(3, ready=False), s(4.5)]) == 4.5
    assert faults.recovered_at([s(0), s(1)]) == 0.0
    assert faults.recovered_at([s(0), s(1, 1)]) is None and faults.recovered_at([]) is None
    never = faults.judge(KILL, [], [s(0), s(1, 1, loaded=1)], {})
    assert "never back to full capacity" in never.problems


def test_status_lies_are_named() -> None:
    # The pods show an engine down, the status shows every adapter loaded on both.
    assert faults.status_lies(KILL, [s(0), s(1, 1), s(2)]) == [
        "no adapter's loadedReplicas dropped although an engine was down"
    ]
    assert faults.status_lies(KILL, [s(0), s(1, 1, loaded=1), s(2)]) == []
    assert faults.status_lies(KILL, [s(0), s(1)]) == []  # never down: nothing to drop
    assert faults.status_lies(ROLL, [s(0), s(1)]) == ["Ready never went False during the roll"]
    down = [s(0), *(s(t, 1, available=False, loaded=1) for t in (1, 6, 11)), s(12)]
    assert faults.status_lies(KILL, down) == ["Available False from 1.0s while 1 engines and a router served"]
    assert faults.status_lies(KILL, down[:3] + down[4:]) == []  # 5 s behind the pods: its reaction time
    assert faults.status_lies(KILL, [s(0), s(1, 0, loaded=0)]) == [  # still wrong at the end
        "Available True from 1.0s with 0 engines, 2 routers"
    ]
    # Not converged (a roll in progress) is not full capacity, whatever the counts say.
    rolling = Sample(0, 2, 2, 2, 2, True, True, (2, 2), 2, converged=False)
    assert not rolling.full and faults.recovered_at([rolling]) is None


def test_retries_are_read_per_router_and_a_restarted_router_counts_from_zero() -> None:
    page = (
        "# HELP lorapool_router_retries_total Retries.\n# TYPE lorapool_router_retries_total counter\n"
        'lorapool_router_retries_total{reason="connect"} 3.0\nlorapool_router_retries_total{reason="departed"} 1.0\n'
    )
    assert faults.retries(page) == {"connect": 3, "departed": 1}
    assert faults.retries("") == {}
    before = {"r-1": {"connect": 2}, "r-gone": {"connect": 9}}
    after = {"r-1": {"connect": 3, "departed": 1}, "r-new": {"503": 2}}
    assert faults.retries_delta(before, after) == {"503": 2, "connect": 1, "departed": 1}


def test_the_report_has_a_row_per_fault_under_the_header() -> None:
    outcomes = [Outcome(0, 0.1, 200), Outcome(1, 0.3, 503), Outcome(2, 0.2, None, faults.RESET)]
    result = faults.judge(ROUTER, outcomes, [s(0), s(1)], {"connect": 2})
    lines = faults.report([result]).splitlines()
    assert lines[0].startswith("| Fault | CI |") and lines[1].startswith("|---")
    assert lines[2] == (
        "| a router container SIGKILLed (one of two) | yes | 3 | 1 | 1 (resets of requests on the killed router) "
        "| 503: 1 | connect: 2 | 0 s | 0.3 s | engines ready >= 2/2, routers >= 2/2, loadedReplicas >= 2/2, "
        "Ready True throughout, Available True throughout | yes |"
    )
    lied = faults.judge(ROLL, [], [s(0)], {})
    assert faults.row(lied).endswith("| no: Ready never went False during the roll |")


def test_observed_names_the_lowest_counts_and_when_each_condition_was_false() -> None:
    roll = [s(0), s(2, 1, ready=False, loaded=1), s(9, 2, ready=False), s(12)]
    assert faults.observed(roll) == (
        "engines ready >= 1/2, routers >= 2/2, loadedReplicas >= 1/2, Ready False 2-9 s, Available True throughout"
    )
    assert faults.observed([]) == "no sample"


def test_a_404_for_an_adapter_the_pool_serves_is_a_problem_not_a_clean_error() -> None:
    result = faults.judge(ROLL, [Outcome(0, 0.1, 404), Outcome(1, 0.1, 503)], [s(0), s(1, ready=False), s(9)], {})
    assert result.unclean == 0 and result.errors == {"404": 1, "503": 1}
    assert result.problems == ("1 requests for an adapter the pool serves were answered 404",)
