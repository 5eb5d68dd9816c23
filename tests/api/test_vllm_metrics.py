"""The one vLLM metrics reader: pages as vLLM 0.32 writes them (the lora_requests_info lists as
measured in tests/engine/test_observations_real.py), the version table, the residency gauges of
vllm #54830, odd labels."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lorapool.api.vllm_metrics import (
    DEFAULT_FAMILY,
    FAMILIES,
    LoadedAdapter,
    VllmMetrics,
    family_of,
    parse_metrics,
    parse_with,
)

# A vLLM 0.32 page as the CPU build writes it (HELP/TYPE lines included), cut to the families the
# reader reads plus one it does not; two lora_requests_info label sets, the newer one current. As
# measured with --max-loras 4 and requests of five adapters: the running batch's four adapters in
# both labels, the fifth (all its requests waiting) in neither.
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="base"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.42
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b,c,d",waiting_lora_adapters="a,b,c,d"} 1.8e9
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="base"} 5.0
"""

# The same shapes with the counters the sidecar reads: preemptions, finished requests by reason
# (abort does not count), a TTFT histogram over two label sets (summed per bound).
COUNTERS_PAGE = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="base"} 4.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="base"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="base"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="base"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="base"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="base"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="base"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="base"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="base"} 3.5
vllm:prompt_tokens_total{engine="0",model_name="base"} 99.0
"""

INF = float("inf")
PAGES = {
    "vllm page, newest lora info wins": (
        VLLM_PAGE,
        VllmMetrics(
            running=3, waiting=2, kv_usage=0.42, max_loras=4, ttft_buckets=((0.1, 5.0),),
            running_adapters=frozenset("abcd"),
        ),
    ),
    "lists that differ (no supported vLLM writes them): the union is the batch, none waiting": (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters="b"} 1\n',
        VllmMetrics(max_loras=2, running_adapters=frozenset("ab")),
    ),
    "counters and the ttft histogram": (
        COUNTERS_PAGE,
        VllmMetrics(preemptions_total=4.0, finished_total=9.0, ttft_buckets=((0.1, 6.0), (INF, 10.0))),
    ),
    "empty page": ("", VllmMetrics()),
    "pre-0.10 kv name": ("vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 1\n", VllmMetrics(running=1, kv_usage=0.5)),
    "odd labels": (
        'vllm:lora_requests_info{max_lora="x",running_lora_adapters=" a , ",waiting_lora_adapters=""} 1\n',
        VllmMetrics(running_adapters=frozenset({"a"})),
    ),
    "an equal stamp: the later line wins": (
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 5\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters=""} 5\n',
        VllmMetrics(max_loras=2, running_adapters=frozenset({"b"})),
    ),
    "kv usage clamped to 1": ("vllm:kv_cache_usage_perc 1.5\n", VllmMetrics(kv_usage=1.0)),
}  # fmt: skip


@pytest.mark.parametrize(("page", "expected"), PAGES.values(), ids=PAGES.keys())
def test_parse_metrics(page: str, expected: VllmMetrics) -> None:
    assert parse_metrics(page) == expected


def test_the_lists_as_the_router_and_the_sidecar_read_them() -> None:
    got = parse_metrics(VLLM_PAGE)
    assert got.listed_adapters == set("abcd") and got.waiting_only == set()  # waits do not show on 0.32
    assert (got.slots, got.gpu_adapters) == (4, set("abcd"))  # inferred: no residency gauges on the page


def lora_page(max_lora: str) -> str:
    return f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="",waiting_lora_adapters=""}} 1\n'


# One reading of max_lora for router and sidecar (they differed: int() with a fallback vs isdigit):
# the decimal digits vLLM writes, positive; anything else is not a slot count.
@pytest.mark.parametrize(
    ("raw", "max_loras"),
    [("4", 4), ("512", 512), ("0", None), ("-1", None), (" 4", None), ("+4", None), ("4.0", None), ("x", None),
     ("", None), ("²", None), ("٤", None)],
    ids=["4", "512", "zero", "negative", "space", "plus", "float", "word", "empty", "superscript", "arabic-indic"],
)  # fmt: skip
def test_max_lora_is_read_one_way(raw: str, max_loras: int | None) -> None:
    assert parse_metrics(lora_page(raw)).max_loras == max_loras


def test_junk_raises() -> None:
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running{ not prometheus\n")


@pytest.mark.parametrize(
    ("version", "family"),
    [(None, DEFAULT_FAMILY), ("0.32.0", "0.32"), ("v0.32.1rc1", "0.32"), (" 0.32 ", "0.32"), ("0.34.0", "0.34"),
     ("0.34.0+sim", "0.34"), ("0.40.0", None), ("0.33.1", None), ("0.3.2", None), ("nightly", None), ("", None)],
    ids=["not given: the default", "0.32.0", "v-prefixed rc", "padded", "0.34.0", "the simulator's 0.34",
         "a newer family", "an unsupported one between", "no such family", "not a version", "empty"],
)  # fmt: skip
def test_a_version_finds_its_row(version: str | None, family: str | None) -> None:
    row = family_of(version)
    assert (row.name if row is not None else None) == family


def test_an_unknown_version_is_reported_and_never_misread() -> None:
    got = parse_metrics(VLLM_PAGE, version="0.99.0")
    assert got == VllmMetrics(family=None)
    assert got.family is None and got.max_loras is None and not got.listed_adapters
    assert parse_metrics(VLLM_PAGE, version="0.32.0") == parse_metrics(VLLM_PAGE)


def test_every_row_names_the_facts_it_reads_once() -> None:
    for name, row in FAMILIES.items():
        assert row.name == name
        names = row.names()
        assert len(names) == len(set(names)), f"{name}: a metric name serves two facts"
    assert DEFAULT_FAMILY in FAMILIES


# vllm #54830's per-adapter residency gauges (in review; no supported release has them): every row
# names them, so a page that carries them is read, and they win over what lora_requests_info infers.
GAUGES_PAGE = """\
vllm:lora_adapter_loaded{adapter_name="sql",level="gpu",pinned="false",rank="16"} 1.0
vllm:lora_adapter_loaded{adapter_name="chat",level="cpu",pinned="true",rank="8"} 1.0
vllm:lora_adapter_loaded{adapter_name="gone",level="gpu",pinned="false",rank="8"} 0.0
vllm:num_gpu_loaded_lora_adapters{engine="0",model_name="base"} 1.0
vllm:max_gpu_lora_adapters{engine="0",model_name="base"} 4.0
vllm:num_requests_running{engine="0",model_name="base"} 1.0
vllm:lora_requests_info{max_lora="3",running_lora_adapters="chat",waiting_lora_adapters="chat"} 1
"""
EXPOSED_NONE_LOADED = "vllm:max_gpu_lora_adapters 2\nvllm:num_gpu_loaded_lora_adapters 0\n"


def test_residency_gauges_are_read_when_present() -> None:
    got = parse_metrics(GAUGES_PAGE, version="0.34.0")
    assert got.family == "0.34" and got.running == 1
    assert got.loaded_adapters == {"sql": LoadedAdapter("gpu", False, 16), "chat": LoadedAdapter("cpu", True, 8)}
    assert (got.gpu_loaded, got.max_gpu) == (1, 4)


# Which source answers "how many slots" and "which adapters hold one", with and without the gauges.
RESIDENCY = {
    "no gauges: max_lora and the running batch": (VLLM_PAGE, 4, frozenset("abcd"), None),
    "gauges win over lora_requests_info": (GAUGES_PAGE, 4, frozenset({"sql"}), {"sql", "chat"}),
    "gauges exposed, nothing loaded": (EXPOSED_NONE_LOADED, 2, frozenset(), set()),
}


@pytest.mark.parametrize(("page", "slots", "gpu", "loaded"), RESIDENCY.values(), ids=RESIDENCY.keys())
def test_which_source_says_what_the_slots_hold(
    page: str, slots: int, gpu: frozenset[str], loaded: set[str] | None
) -> None:
    got = parse_metrics(page)
    assert (got.slots, got.gpu_adapters) == (slots, gpu)
    assert (set(got.loaded_adapters) if got.loaded_adapters is not None else None) == loaded


def test_a_row_without_the_gauges_never_reads_them() -> None:
    row = replace(FAMILIES[DEFAULT_FAMILY], name="no-gauges", adapter_loaded=None, gpu_loaded=None, max_gpu=None)
    plain = parse_with(GAUGES_PAGE, row)
    assert (plain.loaded_adapters, plain.gpu_loaded, plain.max_gpu, plain.slots) == (None, None, None, 3)
