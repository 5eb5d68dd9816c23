"""An engine's observations over a window, from samples of its ``/metrics`` page. Pure.

The sidecar's ``reporter.Observer`` scrapes the engine next to it (loopback inside the pod:
nothing outside the pod polls an engine) and feeds each page to ``Window``; when a window
closes its summary (``api.report.Observations``) goes into the sidecar's report, the one
channel sizing and placement read.

Which vLLM signals are trustworthy (checked against vLLM 0.32's CPU build in tests/conformance);
the page is read by the one reader, ``api.vllm_metrics`` (names and list meanings per vLLM
version, the "largest value is current" rule for ``vllm:lora_requests_info``):

- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
  and the ``vllm:num_preemptions_total`` counter: exact, read as they are;
- ``vllm:lora_requests_info``: its ``max_lora`` label is the engine's --max-loras (vllm #54830's
  ``vllm:max_gpu_lora_adapters`` wins when the page has it). Its adapter lists, measured on vLLM
  0.32's CPU build (tests/engine/test_observations_real.py) and read the same in 0.34's source:
  both ``running_lora_adapters`` and ``waiting_lora_adapters`` list the adapters of the *running
  batch* (an adapter from its first request's first token to its last request's end), the same
  names in both; adapters whose requests all wait are in neither, and between two batches the
  lists can be empty while requests wait. So the distinct adapters counted here are those in the
  running batch: trustworthy, but censored at ``max_lora`` (demand beyond the slots does not
  show); which adapters wait is not observable (``waiting_only`` stays empty on 0.32 and 0.34; an
  engine whose row keeps the lists apart fills it). The simulator lists them as vLLM does;
- slot waits are therefore inferred from exact signals: requests waiting while every slot is
  busy (as many adapters running as ``max_lora``) and the KV cache has room;
- the lists are a snapshot of the last engine step, not of the scrape instant: an idle
  engine keeps showing the last set until its next step, so a window needs many samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lorapool.api.report import KV_FREE_BELOW, AdapterLoad, Observations
from lorapool.api.vllm_metrics import VllmMetrics, parse_metrics


@dataclass(frozen=True)
class Sample:
    """One scrape, reduced to what sizing needs."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    preemptions_total: float = 0.0
    max_loras: int | None = None
    inflight: frozenset[str] = frozenset()  # adapters listed: the running batch's
    waiting_only: frozenset[str] = frozenset()  # listed waiting and not running
    ttft_buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), all label sets summed
    finished_total: float = 0.0  # requests finished with stop or length (vllm:request_success_total)

    @classmethod
    def of(cls, metrics: VllmMetrics) -> Sample:
        """The sample of one page, as the one reader read it."""
        return cls(
            running=metrics.running,
            waiting=metrics.waiting,
            kv_usage=metrics.kv_usage,
            preemptions_total=metrics.preemptions_total,
            max_loras=metrics.slots,
            inflight=metrics.listed_adapters,
            waiting_only=metrics.waiting_only,
            ttft_buckets=metrics.ttft_buckets,
            finished_total=metrics.finished_total,
        )

    @property
    def slot_bound(self) -> bool:
        """Requests wait while every slot is busy and the KV cache has room: waits more slots would end."""
        return (
            self.waiting > 0
            and self.max_loras is not None
            and len(self.inflight) >= self.max_loras
            and self.kv_usage < KV_FREE_BELOW
        )

    @property
    def kv_bound(self) -> bool:
        """Requests wait while the KV cache is full: more slots would only take memory from it."""
        return self.waiting > 0 and self.kv_usage >= KV_FREE_BELOW


def parse_sample(text: str, version: str | None = None) -> Sample:
    """Parse an engine's /metrics page by its version's row (``api.vllm_metrics``); missing series
    keep their defaults; junk, or a version no row reads (nothing is guessed), raises ValueError."""
    metrics = parse_metrics(text, version)
    if metrics.family is None:
        raise ValueError(f"the engine's version {version!r} is not a release a metrics row reads (api.vllm_metrics)")
    return Sample.of(metrics)


def histogram_quantile(
    start: Sequence[tuple[float, float]], end: Sequence[tuple[float, float]], q: float
) -> float | None:
    """The q-quantile (0-1) of what a cumulative histogram observed between two scrapes, as
    Prometheus' histogram_quantile does it (linear within the bucket); None when nothing was observed.
    A bucket above the largest finite bound answers that bound."""
    before = dict(start)
    delta = [(le, count - before.get(le, 0.0)) for le, count in end]
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le, cumulative in delta:
        if cumulative >= rank:
            if le == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, cumulative
    return lower


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100) of ``values``; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n*q/100), at least the first
    return float(ordered[int(rank) - 1])


@dataclass
class Window:
    """Tumbling windows of ``window_s`` seconds; ``add`` returns the summary of a window it closes.

    Each sample counts for the time since the previous one, capped at ``max_gap_s`` so that a
    stalled scraper does not credit one sample with minutes.
    """

    window_s: float = 60.0
    max_gap_s: float = 10.0
    start: float | None = None
    _last_t: float | None = None
    _samples: list[Sample] = field(default_factory=list)
    _dt: list[float] = field(default_factory=list)
    _first: Sample | None = None

    def add(self, sample: Sample, t: float) -> Observations | None:
        """Record ``sample`` scraped at Unix time ``t``; the closed window's summary when ``t`` ends one."""
        if self.start is None:
            self.start, self._first = t, sample
        dt = 0.0 if self._last_t is None else min(max(t - self._last_t, 0.0), self.max_gap_s)
        self._last_t = t
        self._samples.append(sample)
        self._dt.append(dt)
        if t - self.start < self.window_s:
            return None
        summary = summarize(self._samples, self._dt, window_s=t - self.start, end=t, first=self._first)
        self.start, self._first = t, sample
        self._samples, self._dt = [sample], [0.0]
        return summary


def summarize(
    samples: Sequence[Sample], dt: Sequence[float], *, window_s: float, end: float, first: Sample | None = None
) -> Observations:
    """The window's ``Observations``; ``dt[i]`` is the time sample ``i`` stands for; counters
    (preemptions, TTFT histogram, finished requests) count from ``first`` (default: the first sample)."""
    distinct = [len(s.inflight) for s in samples]
    kv = [s.kv_usage for s in samples]
    inflight_s: dict[str, float] = {}
    waiting_s: dict[str, float] = {}
    for s, d in zip(samples, dt, strict=True):
        for name in s.inflight:
            inflight_s[name] = inflight_s.get(name, 0.0) + d
        for name in s.waiting_only:
            waiting_s[name] = waiting_s.get(name, 0.0) + d
    first = first or samples[0]
    last = samples[-1]
    ttft_p99 = histogram_quantile(first.ttft_buckets, last.ttft_buckets, 0.99)
    ttft_p50 = histogram_quantile(first.ttft_buckets, last.ttft_buckets, 0.50)
    max_loras = next((s.max_loras for s in reversed(samples) if s.max_loras is not None), None)
    return Observations(
        window_s=window_s,
        end=end,
        samples=len(samples),
        max_loras=max_loras,
        distinct_p50=percentile(distinct, 50),
        distinct_p95=percentile(distinct, 95),
        distinct_max=max(distinct, default=0),
        slot_wait_s=sum(d for s, d in zip(samples, dt, strict=True) if s.slot_bound),
        kv_wait_s=sum(d for s, d in zip(samples, dt, strict=True) if s.kv_bound),
        kv_usage_p50=percentile(kv, 50),
        kv_usage_p95=percentile(kv, 95),
        kv_usage_max=max(kv, default=0.0),
        running_p95=percentile([s.running for s in samples], 95),
        waiting_p95=percentile([s.waiting for s in samples], 95),
        preemptions=max(0, int(last.preemptions_total - first.preemptions_total)),
        finished=max(0, int(last.finished_total - first.finished_total)),
        ttft_p50_s=ttft_p50,
        ttft_p99_s=ttft_p99,
        adapters={name: AdapterLoad(inflight_s[name], waiting_s.get(name, 0.0)) for name in sorted(inflight_s)},
    )
