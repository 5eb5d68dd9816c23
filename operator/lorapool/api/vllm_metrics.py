"""The one reader of a vLLM ``/metrics`` page: text in, a typed ``VllmMetrics`` out. Pure.

The router (``router.core.state``: foreign load, slots, KV usage) and the sidecar
(``sidecar.observations``: the sizing window) both read an engine's page through
``parse_metrics``; the import contracts keep router, sidecar and simulator apart, so the reader
lives here, below all three.

What differs between vLLM versions lives in ``FAMILIES``, one row per supported version family
("major.minor", the support matrix in ``api.vllm_versions``): which metric names the family
exposes for each fact and how its ``lora_requests_info`` lists read. Adding a version is adding
a row; a fact a row does not name is not read. ``parse_metrics(text, version)`` reads by the row
of ``version`` (the engine's ``GET /version``); without one (a caller that does not know its
engine's version) by ``DEFAULT_FAMILY``, the CPU tier's. A version no row knows is reported as
such (``VllmMetrics.family`` is None) and nothing on its page is read: an unknown engine is never
misread as a known one.

Meanings shared by every family so far (section 1 of the design):

- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``: summed over the page's label
  sets; ``vllm:kv_cache_usage_perc``: the largest, clamped to [0, 1];
- ``vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}``: one series
  per label set whose value is the Unix time it was last set; older label sets stay on the page,
  so the sample with the largest value is current. ``max_lora`` is the engine's ``--max-loras``
  (decimal digits, else not read). The lists are comma-separated adapter names; what they hold
  is the row's ``lora_lists`` (``LoraLists``), read from vLLM's source and measured on the real
  engine (tests/engine/test_observations_real.py);
- the per-adapter residency gauges of vllm #54830 (``vllm:lora_adapter_loaded{adapter_name,
  level,pinned,rank}``, ``vllm:num_gpu_loaded_lora_adapters``, ``vllm:max_gpu_lora_adapters``):
  no supported release exposes them (0.32 and 0.34 checked in their sources), every row names
  them so a page that carries them is read; when present they win over what
  ``lora_requests_info`` lets us infer (``VllmMetrics.slots``, ``VllmMetrics.gpu_adapters``);
- counters (preemptions, finished requests, the TTFT histogram's buckets) are read as totals:
  their users take differences between two pages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import NamedTuple, assert_never

from prometheus_client.parser import text_string_to_metric_families

from lorapool.api.vllm_versions import family_name

# finished_reason values that count as served (not abort), for ``finished_total``.
FINISHED_OK = frozenset({"stop", "length"})


class LoraLists(StrEnum):
    """What the two adapter lists of ``vllm:lora_requests_info`` hold, per family.

    SCHEDULED (vLLM 0.32 and 0.34: ``LoRARequestStates`` in ``vllm/v1/metrics/stats.py``, the same
    code in both): the serving layer learns of a request's QUEUED and SCHEDULED events only with
    its first output, so an adapter is listed from its first request's first token until its last
    request finishes (a preempted request keeps it listed); both labels carry the same names, the
    per-adapter counts dropped. Adapters whose requests all wait are in neither list. Read: the
    list is the running batch (``running_adapters``); nothing is read as waiting."""

    SCHEDULED = "scheduled"


@dataclass(frozen=True)
class Family:
    """The metric names one vLLM version family exposes, fact by fact.

    A tuple lists every name the fact has had, the current one first; older names stay because a
    page never carries two of them. None: the family does not expose the fact."""

    name: str
    running: str = "vllm:num_requests_running"
    waiting: str = "vllm:num_requests_waiting"
    kv_usage: tuple[str, ...] = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the 2nd before 0.10
    preemptions: tuple[str, ...] = ("vllm:num_preemptions_total", "vllm:num_preemptions")
    finished: tuple[str, ...] = ("vllm:request_success_total", "vllm:request_success")
    ttft_bucket: str = "vllm:time_to_first_token_seconds_bucket"
    lora_info: str | None = "vllm:lora_requests_info"
    lora_lists: LoraLists = LoraLists.SCHEDULED
    # Per-adapter residency (vllm #54830, in review; not in 0.32 or 0.34, read when a page has them):
    # one series per loaded adapter, ``{adapter_name, level, pinned, rank}``; adapters in GPU slots;
    # GPU slots. None: the family never exposes the fact.
    adapter_loaded: str | None = "vllm:lora_adapter_loaded"
    gpu_loaded: str | None = "vllm:num_gpu_loaded_lora_adapters"
    max_gpu: str | None = "vllm:max_gpu_lora_adapters"

    def names(self) -> tuple[str, ...]:
        """Every sample name this family's reading looks at."""
        one = (self.running, self.waiting, self.ttft_bucket, self.lora_info)
        gauges = (self.adapter_loaded, self.gpu_loaded, self.max_gpu)
        many = (*self.kv_usage, *self.preemptions, *self.finished)
        return tuple(n for n in (*one, *gauges, *many) if n is not None)


# One row per supported vLLM version family ("major.minor"; api.vllm_versions names the releases).
# 0.32: the CPU build the real-engine tier runs (tests/conformance, tests/engine); 0.34: the default
# image. Their metrics code for these facts is the same (loggers.py, stats.py compared), so are the rows.
FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in (Family("0.32"), Family("0.34"))})
DEFAULT_FAMILY = "0.32"


def family_of(version: str | None) -> Family | None:
    """The row that reads ``version`` (``0.32.0``, ``v0.32.1rc1``...); the default row when no
    version is given; None for a version no row knows."""
    if version is None:
        return FAMILIES[DEFAULT_FAMILY]
    family = family_name(version)
    return FAMILIES.get(family) if family else None


class LoadedAdapter(NamedTuple):
    """One adapter an engine holds, by its per-adapter residency gauge."""

    level: str  # "gpu" (a slot) or "cpu" (the CPU LoRA cache)
    pinned: bool
    rank: int | None


@dataclass(frozen=True)
class VllmMetrics:
    """One page of an engine's metrics, read by its version's row (defaults: not on the page)."""

    family: str | None = DEFAULT_FAMILY  # the row it was read by; None: unknown version, nothing read
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # 0..1
    preemptions_total: float = 0.0
    finished_total: float = 0.0  # requests finished with stop or length
    ttft_buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), label sets summed
    # The current vllm:lora_requests_info sample, read by the row's ``lora_lists`` (max_loras None:
    # no sample or no usable max_lora): the adapters of the running batch, and those whose requests
    # wait, where the family shows them (SCHEDULED families do not: always empty there).
    max_loras: int | None = None
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    # Per-adapter residency gauges (vllm #54830); None: not on the page.
    loaded_adapters: Mapping[str, LoadedAdapter] | None = None
    gpu_loaded: int | None = None
    max_gpu: int | None = None

    @property
    def listed_adapters(self) -> frozenset[str]:
        """Every adapter the current LoRA sample lists, running or waiting."""
        return self.running_adapters | self.waiting_adapters

    @property
    def waiting_only(self) -> frozenset[str]:
        """Adapters whose requests all wait (empty where the family does not show them)."""
        return self.waiting_adapters - self.running_adapters

    @property
    def slots(self) -> int | None:
        """The engine's GPU LoRA slots: the residency gauge when present, else ``max_lora``."""
        return self.max_gpu if self.max_gpu is not None else self.max_loras

    @property
    def gpu_adapters(self) -> frozenset[str]:
        """Adapters in GPU slots: by the residency gauges when present; else inferred from
        ``lora_requests_info`` as the running batch's (each holds a slot; an idle slot's holder,
        kept by the engine's LRU, does not show)."""
        if self.loaded_adapters is None:
            return self.running_adapters
        return frozenset(n for n, a in self.loaded_adapters.items() if a.level == "gpu")


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _count(raw: str) -> int | None:
    """A positive count as vLLM writes it (decimal digits); None for anything else."""
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) > 0 else None


def _samples(text: str, wanted: tuple[str, ...]) -> Iterator[tuple[str, Mapping[str, str], float]]:
    """(name, labels, value) of the samples whose line starts with a wanted name; the rest is not
    parsed (a page has ~60 families). Junk among the wanted lines raises ValueError."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith(wanted)) + "\n"
    for family in text_string_to_metric_families(lines):
        for s in family.samples:
            yield s.name, s.labels, s.value


def parse_metrics(text: str, version: str | None = None) -> VllmMetrics:
    """Read an engine's /metrics page by the row of ``version`` (see the module docstring)."""
    row = family_of(version)
    return parse_with(text, row) if row is not None else VllmMetrics(family=None)


def parse_with(text: str, row: Family) -> VllmMetrics:
    """Read a page by one row of the table; missing series keep their defaults, junk raises ValueError."""
    running = waiting = kv = preemptions = finished = 0.0
    info: tuple[float, Mapping[str, str]] | None = None
    buckets: dict[float, float] = {}
    loaded: dict[str, LoadedAdapter] = {}
    gauges: dict[str, int] = {}
    for name, labels, value in _samples(text, row.names()):
        if name == row.ttft_bucket:
            le = float(labels.get("le", "inf"))
            buckets[le] = buckets.get(le, 0.0) + value
        elif name in row.finished:
            finished += value if labels.get("finished_reason") in FINISHED_OK else 0.0
        elif name == row.running:
            running += value
        elif name == row.waiting:
            waiting += value
        elif name in row.kv_usage:
            kv = max(kv, value)
        elif name in row.preemptions:
            preemptions += value
        elif name == row.lora_info and (info is None or value >= info[0]):
            info = (value, labels)
        elif name == row.adapter_loaded:
            gauges[name] = 1  # exposed, even if no adapter is loaded
            if value > 0 and labels.get("adapter_name"):
                loaded[labels["adapter_name"]] = _loaded(labels)
        elif name in (row.gpu_loaded, row.max_gpu):
            gauges[name] = gauges.get(name, 0) + int(value)
    lora = info[1] if info is not None else {}
    running_names, waiting_names = _lora_lists(row.lora_lists, lora)
    exposed = row.adapter_loaded in gauges or row.max_gpu in gauges
    return VllmMetrics(
        family=row.name,
        running=int(running),
        waiting=int(waiting),
        kv_usage=min(max(kv, 0.0), 1.0),
        preemptions_total=preemptions,
        finished_total=finished,
        ttft_buckets=tuple(sorted(buckets.items())),
        max_loras=_count(lora.get("max_lora", "")),
        running_adapters=running_names,
        waiting_adapters=waiting_names,
        loaded_adapters=MappingProxyType(loaded) if exposed else None,
        gpu_loaded=gauges.get(row.gpu_loaded) if row.gpu_loaded else None,
        max_gpu=gauges.get(row.max_gpu) if row.max_gpu else None,
    )


def _lora_lists(lists: LoraLists, labels: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """(running batch, waiting) adapters of one lora_requests_info sample, as ``lists`` reads it."""
    running, waiting = _names(labels.get("running_lora_adapters", "")), _names(labels.get("waiting_lora_adapters", ""))
    match lists:
        case LoraLists.SCHEDULED:  # both labels carry the same names: the running batch's
            return running | waiting, frozenset()
        case _:
            assert_never(lists)


def _loaded(labels: Mapping[str, str]) -> LoadedAdapter:
    rank = labels.get("rank", "")
    return LoadedAdapter(labels.get("level", ""), labels.get("pinned") == "true", int(rank) if rank.isdigit() else None)
