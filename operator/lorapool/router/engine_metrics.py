"""Read the few vLLM metrics routing needs from a /metrics page. Pure.

vLLM names (section 1 of the design): ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc``
before vLLM 0.10), and ``vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}`` whose value is a timestamp: vLLM may leave older label sets in
the page, so the sample with the largest value is the current one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
LORA_INFO = "vllm:lora_requests_info"
_WANTED = (RUNNING, WAITING, *KV_USAGE, LORA_INFO)


@dataclass(frozen=True)
class EngineMetrics:
    """One scrape of a replica, reduced to what the router uses."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    max_loras: int | None = None
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()

    @property
    def active_adapters(self) -> frozenset[str]:
        """Adapters the engine is running or holding: each needs (or waits for) a slot."""
        return self.running_adapters | self.waiting_adapters


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _relevant_lines(text: str) -> Iterable[str]:
    for line in text.splitlines():
        if line.startswith(_WANTED):
            yield line


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Parse a Prometheus text page; missing metrics keep their defaults, junk raises ValueError."""
    running = waiting = 0.0
    kv = 0.0
    info: tuple[float, dict[str, str]] | None = None
    for family in text_string_to_metric_families("\n".join(_relevant_lines(text)) + "\n"):
        for sample in family.samples:
            if sample.name == RUNNING:
                running += sample.value
            elif sample.name == WAITING:
                waiting += sample.value
            elif sample.name in KV_USAGE:
                kv = max(kv, sample.value)
            elif sample.name == LORA_INFO and (info is None or sample.value >= info[0]):
                info = (sample.value, dict(sample.labels))
    max_loras: int | None = None
    running_adapters = waiting_adapters = frozenset[str]()
    if info is not None:
        labels = info[1]
        try:
            max_loras = int(labels.get("max_lora", ""))
        except ValueError:
            max_loras = None
        running_adapters = _names(labels.get("running_lora_adapters", ""))
        waiting_adapters = _names(labels.get("waiting_lora_adapters", ""))
    return EngineMetrics(
        running=int(running),
        waiting=int(waiting),
        kv_usage=min(max(kv, 0.0), 1.0),
        max_loras=max_loras if max_loras and max_loras > 0 else None,
        running_adapters=running_adapters,
        waiting_adapters=waiting_adapters,
    )
