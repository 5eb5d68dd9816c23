"""Prometheus metrics with vLLM's names (``vllm/v1/metrics/loggers.py``), plus ``sim:`` extras.

Gauges and counters are read from the engine at scrape time (nothing to update per step);
histograms are observed once per request by the shell. Every ``vllm:`` series carries vLLM's
labels ``model_name`` (the first served model name) and ``engine`` ("0").

``vllm:lora_requests_info`` behaves as vLLM 0.32's and 0.34's (``LoRARequestStates`` in
``vllm/v1/metrics/stats.py``, the same code in both; measured in tests/engine/test_observations_real.py,
checked in ``tests/conformance``): after every engine step the series labelled with the current
adapters is set to the current Unix time; both ``running_lora_adapters`` and
``waiting_lora_adapters`` list the same names, the adapters of the running batch (each from its
first request's first token until its last request ends; ``Engine.listed_adapter_names``), and an
adapter whose requests all wait is in neither. Series for earlier label sets stay in the output
with their older timestamps. A reader takes the series with the largest value, as the Gateway
API Inference Extension does. Simulator-only series are under ``sim:`` so nobody mistakes them for vLLM's.

The names of the facts lorapool reads come from the release's row of ``api.vllm_metrics.FAMILIES``
(``--vllm-version``), so the simulator writes what that reader reads; the 0.32 and 0.34 rows name
the same metrics today, so both releases' pages are the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lorapool.api.vllm_metrics import DEFAULT_FAMILY, FAMILIES, Family
from lorapool.sim.engine import FINISH_REASONS, Engine, EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ("model_name", "engine")
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class SimMetrics:
    """The /metrics registry of one simulator process."""

    def __init__(
        self, engine: Engine, model_name: str, time_scale: float, family: Family = FAMILIES[DEFAULT_FAMILY]
    ) -> None:
        self.engine = engine
        self.family = family
        self.model_name = model_name
        self.time_scale = time_scale
        self.overrun_s = 0.0  # wall seconds the stepper started later than its schedule
        # (max_lora, waiting, running) -> Unix time of the last step with that label set
        self.lora_info: dict[tuple[str, str, str], float] = {}
        self._lora_key: tuple[str, ...] | None = None
        self._lora_labels: tuple[str, str, str] = ("", "", "")
        self.registry = CollectorRegistry(auto_describe=False)
        labels = (model_name, "0")
        self.ttft = Histogram(
            family.ttft_bucket.removesuffix("_bucket"),
            "Histogram of time to first token in seconds.",
            _LABELS,
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        ).labels(*labels)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LABELS,
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        ).labels(*labels)
        self.registry.register(_EngineCollector(self))

    def record_step(self) -> None:
        """After a step: stamp the lora_requests_info series of the current adapter sets."""
        if not self.engine.config.enable_lora:
            return
        listed = self.engine.listed_adapter_names()
        if listed != self._lora_key:
            self._lora_key = listed
            names = ",".join(listed)
            self._lora_labels = (str(self.engine.config.max_loras), names, names)
        self.lora_info[self._lora_labels] = time.time()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _prefix_cache_families(
    counter: Callable[[str, str, float], CounterMetricFamily], stats: EngineStats
) -> Iterator[CounterMetricFamily]:
    """vLLM's prefix-cache counters (``loggers.py``, 0.32 and 0.34), in tokens: what fresh
    admissions looked up and found (0 with ``--no-enable-prefix-caching``, as vLLM), and the
    cached tokens of prompts that reached their first token."""
    yield counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        stats.prefix_cache_queries,
    )
    yield counter(
        "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_cache_hits
    )
    yield counter(
        "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", stats.prompt_tokens_cached
    )


class _EngineCollector(Collector):
    def __init__(self, metrics: SimMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._vllm_families()
        yield from self._sim_families()

    def _vllm_families(self) -> Iterator[Metric]:
        """The families vLLM itself exports, under its names and labels: what the router and the sizing loop read."""
        m = self.metrics
        engine = m.engine
        stats = engine.stats
        labels = [m.model_name, "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(labels, value)
            return family

        row = m.family
        yield gauge(row.running, "Number of requests in model execution batches.", engine.num_running)
        yield gauge(row.waiting, "Number of requests waiting to be processed.", engine.num_waiting)
        yield gauge(row.kv_usage[0], "KV-cache usage. 1 means 100 percent usage.", engine.kv_cache_usage)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens)
        yield from _prefix_cache_families(counter, stats)
        yield counter(
            row.preemptions[0].removesuffix("_total"),
            "Cumulative number of preemption from the engine.",
            stats.preemptions,
        )
        success = CounterMetricFamily(
            row.finished[0].removesuffix("_total"),
            "Count of successfully processed requests.",
            labels=(*_LABELS, "finished_reason"),
        )
        for reason in FINISH_REASONS:
            success.add_metric([*labels, reason], stats.finished[reason])
        yield success
        # vLLM's cache config as an info gauge (value 1): the GIE EPP reads block_size and num_gpu_blocks
        # from it to size its prefix index (issue 47).
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=("block_size", "num_gpu_blocks"),
        )
        cache.add_metric([str(engine.config.block_size), str(engine.config.num_gpu_blocks)], 1.0)
        yield cache
        if engine.config.enable_lora and row.lora_info is not None:
            info = GaugeMetricFamily(
                row.lora_info,
                "Running stats on lora requests.",
                labels=("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
            )
            for label_values, stamp in m.lora_info.items():
                info.add_metric(list(label_values), stamp)
            yield info

    def _sim_families(self) -> Iterator[Metric]:
        """The simulator's own ``sim:`` families: what a benchmark reads to tell the model from the simulator."""
        m = self.metrics
        stats = m.engine.stats
        loads = CounterMetricFamily(
            "sim:lora_loads",
            "Simulator: adapters copied into a GPU slot inside an engine step or a load call, "
            "by where they came from (cpu = CPU cache hit, disk = CPU cache miss).",
            labels=("from",),
        )
        for source in ("cpu", "disk"):
            loads.add_metric([source], stats.loads[source])
        yield loads
        cold = CounterMetricFamily("sim:lora_cold_loads", "Simulator: first reads of an adapter path.")
        cold.add_metric([], stats.cold_loads)
        yield cold
        stall = CounterMetricFamily(
            "sim:lora_load_stall_seconds",
            "Simulator: simulated seconds the whole batch waited for adapter loads.",
        )
        stall.add_metric([], stats.stall_s)
        yield stall
        busy = CounterMetricFamily("sim:engine_busy_seconds", "Simulator: simulated seconds spent in steps.")
        busy.add_metric([], stats.busy_s)
        yield busy
        steps = CounterMetricFamily("sim:engine_steps", "Simulator: engine steps that ran a batch.")
        steps.add_metric([], stats.steps)
        yield steps
        overrun = CounterMetricFamily(
            "sim:schedule_overrun_seconds",
            "Simulator: wall seconds engine steps started later than the simulated schedule "
            "(the simulator's CPU, not the model, limited throughput; 0 at --time-scale 0).",
        )
        overrun.add_metric([], m.overrun_s)
        yield overrun
        scale = GaugeMetricFamily("sim:time_scale", "Simulator: wall seconds per simulated second.")
        scale.add_metric([], m.time_scale)
        yield scale
