"""Read a Prometheus /metrics page: the one scraper of tests, benchmark and playground.

Parsing uses prometheus_client's own parser, so a page that a real Prometheus would reject
fails here too. The product's router and sidecar read engine pages with the one typed reader
(``lorapool.api.vllm_metrics``); this module is for everything that is not a product path.

    page = scrape("http://127.0.0.1:8000")
    running = metric_value(page, "vllm:num_requests_running")
    aborted = metric_value(page, "vllm:request_success_total", finished_reason="abort")
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(base_url: str, timeout_s: float = 5.0) -> str:
    """The text of ``base_url``/metrics (``base_url`` may already end in /metrics)."""
    url = base_url if base_url.endswith("/metrics") else f"{base_url.rstrip('/')}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


def samples(page: str) -> Samples:
    """Every sample on the page: sample name -> [(labels, value), ...] in page order."""
    out: Samples = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def metric_value(page: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (0 when none)."""
    return sum(value for got, value in samples(page).get(name, []) if _matches(got, labels))


def latest_labels(page: str, name: str) -> dict[str, str] | None:
    """The labels of the sample with the largest value: the current one of an info-style gauge
    such as ``vllm:lora_requests_info``, whose value is the Unix time it was last set."""
    series = samples(page).get(name)
    return max(series, key=lambda s: s[1])[0] if series else None


def _matches(got: dict[str, str], wanted: dict[str, str]) -> bool:
    return all(got.get(key) == value for key, value in wanted.items())
