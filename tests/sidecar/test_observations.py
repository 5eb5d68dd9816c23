"""The report's observations, pure parts: a vLLM /metrics page -> a sample, samples -> a window's
summary, and the summary through the annotation and back."""

from __future__ import annotations

import pytest

from lorapool.api.report import AdapterLoad, Observations, ReplicaReport, decode, encode
from lorapool.sidecar.observations import Sample, Window, histogram_quantile, parse_sample, percentile, summarize


def page(*, running: int, waiting: int, kv: float, preempt: float, lists: list[tuple[float, str, str]]) -> str:
    """A vLLM 0.32-shaped page: lora_requests_info series stamped with times, older ones left behind."""
    labels = 'engine="0",model_name="base"'
    lines = [
        f"vllm:num_requests_running{{{labels}}} {running}",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv}",
        f"vllm:num_preemptions_total{{{labels}}} {preempt}",
        "vllm:prompt_tokens_total{" + labels + "} 9",
    ]
    for stamp, run, wait in lists:
        lines.append(
            f'vllm:lora_requests_info{{max_lora="2",running_lora_adapters="{run}",waiting_lora_adapters="{wait}"}} {stamp}'
        )
    return "\n".join(lines) + "\n"


PAGES = {
    # as measured (tests/engine/test_observations_real.py): the running batch's adapters in both
    # labels; those whose requests all wait in neither
    "vllm-0.32-lists-the-running-batch-in-both": (
        page(running=2, waiting=3, kv=0.2, preempt=1, lists=[(5.0, "a", "a"), (9.0, "a,b", "a,b")]),
        Sample(2, 3, 0.2, 1.0, 2, frozenset("ab"), frozenset()),
    ),
    "lists-that-differ-are-one-batch-on-0.32-and-0.34": (
        page(running=1, waiting=1, kv=0.95, preempt=0, lists=[(9.0, "a", "b")]),
        Sample(1, 1, 0.95, 0.0, 2, frozenset("ab"), frozenset()),
    ),
    "no-lora-series": ("vllm:num_requests_running 0\n", Sample()),
}


@pytest.mark.parametrize(("text", "want"), PAGES.values(), ids=PAGES.keys())
def test_parse_sample(text: str, want: Sample) -> None:
    assert parse_sample(text) == want


SLOT_BOUND = {
    "more-adapters-listed-than-slots-kv-free": (Sample(2, 3, 0.2, 0, 2, frozenset("abc")), True, False),
    "more-adapters-than-slots-kv-full": (Sample(2, 3, 0.95, 0, 2, frozenset("abc")), False, True),
    "every-slot-busy-kv-free": (Sample(2, 3, 0.2, 0, 2, frozenset("ab")), True, False),
    "a-slot-free": (Sample(2, 3, 0.2, 0, 2, frozenset("a")), False, False),
    "nothing-waits": (Sample(2, 0, 0.2, 0, 2, frozenset("abc")), False, False),
}


@pytest.mark.parametrize(("sample", "slot", "kv"), SLOT_BOUND.values(), ids=SLOT_BOUND.keys())
def test_which_wait_a_sample_shows(sample: Sample, slot: bool, kv: bool) -> None:
    assert (sample.slot_bound, sample.kv_bound) == (slot, kv)


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [([], 50, 0.0), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([float(i) for i in range(1, 101)], 95, 95.0)],
    ids=["empty", "one", "median-of-four", "p95-of-100"],
)
def test_percentile(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == want


def test_a_window_closes_with_time_weighted_loads_and_preemptions_since_it_opened() -> None:
    w = Window(window_s=10.0, max_gap_s=5.0)
    busy = Sample(2, 3, 0.3, 5.0, 2, frozenset("abc"))
    quiet, later = Sample(1, 0, 0.1, 4.0, 2, frozenset("a")), Sample(1, 0, 0.1, 6.0, 2, frozenset("a"))
    assert w.add(quiet, 100.0) is None
    assert w.add(busy, 102.0) is None
    assert w.add(busy, 104.0) is None
    assert w.add(later, 130.0) is not None  # a 26 s gap counts as 5 s
    obs = w.add(later, 140.0)  # the next window: opened at 130 with the last sample
    assert obs is not None and obs.samples == 2 and obs.window_s == 10.0
    first = summarize([quiet, busy, busy, later], [0.0, 2.0, 2.0, 5.0], window_s=30.0, end=130.0)
    assert first.slot_wait_s == 4.0 and first.kv_wait_s == 0.0
    assert first.distinct_max == 3 and first.distinct_p50 == 1.0 and first.distinct_p95 == 3.0
    assert first.adapters == {"a": AdapterLoad(9.0), "b": AdapterLoad(4.0), "c": AdapterLoad(4.0)}
    assert first.preemptions == 2 and first.max_loras == 2


HIST = {
    "interpolates-in-the-bucket": (
        [(0.1, 0), (1.0, 0), (inf := float("inf"), 0)],
        [(0.1, 50), (1.0, 100), (inf, 100)],
        0.99,
        0.982,
    ),
    "counts-only-the-window": ([(0.1, 40), (1.0, 40), (inf, 40)], [(0.1, 40), (1.0, 140), (inf, 140)], 0.5, 0.55),
    "above-the-last-bound-answers-it": ([], [(0.1, 0), (1.0, 0), (inf, 10)], 0.99, 1.0),
    "nothing-observed": ([(0.1, 5), (inf, 5)], [(0.1, 5), (inf, 5)], 0.99, None),
}


@pytest.mark.parametrize(("start", "end", "q", "want"), HIST.values(), ids=HIST.keys())
def test_histogram_quantile(
    start: list[tuple[float, float]], end: list[tuple[float, float]], q: float, want: float | None
) -> None:
    got = histogram_quantile(start, end, q)
    assert got == (None if want is None else pytest.approx(want, abs=1e-3))


def test_ttft_and_goodput_come_from_counters_over_the_window() -> None:
    text = page(running=0, waiting=0, kv=0.0, preempt=0, lists=[])
    labels = 'engine="0",model_name="base"'
    extra = [
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="0.1"}} 10',
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} 10',
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} 7',
        f'vllm:request_success_total{{{labels},finished_reason="abort"}} 3',
    ]
    start, end = parse_sample(text), parse_sample(text + "\n".join(extra) + "\n")
    assert end.finished_total == 7 and end.ttft_buckets == ((0.1, 10.0), (float("inf"), 10.0))
    obs = summarize([start, end], [0.0, 10.0], window_s=10.0, end=10.0)
    assert obs.finished == 7 and obs.goodput == 0.7 and obs.ttft_p99_s == pytest.approx(0.099)


OBS = Observations(
    window_s=60.0,
    end=1_800_000_000.0,
    samples=30,
    max_loras=8,
    distinct_p50=3.0,
    distinct_p95=7.0,
    distinct_max=9,
    slot_wait_s=12.0,
    kv_wait_s=0.0,
    kv_usage_p50=0.25,
    kv_usage_p95=0.5,
    kv_usage_max=0.61,
    running_p95=20.0,
    waiting_p95=4.0,
    preemptions=1,
    finished=90,
    ttft_p50_s=0.05,
    ttft_p99_s=1.25,
    adapters={"a": AdapterLoad(58.0, 2.0), "b": AdapterLoad(6.0)},
)


def test_observations_survive_the_annotation() -> None:
    back = decode(encode(ReplicaReport(engine_healthy=True, observations=OBS)))
    assert back is not None and back.observations == OBS


def test_a_report_without_or_with_broken_observations_still_reads() -> None:
    plain = decode(encode(ReplicaReport(engine_healthy=True)))
    assert plain is not None and plain.observations is None
    broken = decode('{"v":1,"engine":"Healthy","adapters":{},"obs":{"w":"x"}}')
    assert broken is not None and broken.engine_healthy and broken.observations is None
