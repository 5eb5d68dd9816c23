"""What the sidecar's observer sees on a real vLLM (CPU build): the signals sizing trusts.

One vLLM with ``--max-loras 1`` and three adapters gets six concurrent requests; the metrics page is
sampled as the sidecar samples it (``sidecar.observations``) while they run. What vLLM 0.32 shows
(measured 2026-12-04; 0.34's ``LoRARequestStates`` is the same code): ``vllm:lora_requests_info``
lists only the running batch's adapter, the same name in its running and its waiting label, while
the four requests of the other two wait (``m-a`` with 2 running and 4 waiting, then an empty list
with 4 waiting, then ``m-b`` with 2 and 2 ...), so the distinct count is censored at the slot count
and no adapter is ever waiting-only; the waits themselves show as slot waits (requests waiting,
every slot busy, KV cache free); every request is counted finished, with a TTFT p99; and the
recommendation from that window grows the one slot (docs/sizing.md).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from lorapool.api.vllm_metrics import family_of, parse_metrics
from lorapool.plan.sizing import MIN_SAMPLES, Action, SlotBounds, pool_evidence, recommend
from lorapool.sidecar.observations import Sample, summarize
from lorapool_dev.engine.fixtures import engine_or_skip
from lorapool_dev.engine.replicas import replica_configs, start_engines, stop_engines
from lorapool_dev.engine.server import ServeConfig
from lorapool_dev.engine.tinymodel import ensure_tiny_model, write_tiny_adapter
from lorapool_dev.testing.processes import ProcessError
from lorapool_dev.testing.scrape import latest_labels

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

ADAPTERS = ("obs-a", "obs-b", "obs-c")


def _complete(url: str, model: str) -> int:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 96, "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return int(resp.status)


def test_a_window_on_vllm_shows_slot_demand_waits_and_latency(tmp_path: Path) -> None:
    install = engine_or_skip()
    modules = tuple((n, str(write_tiny_adapter(tmp_path / n, seed=300 + i))) for i, n in enumerate(ADAPTERS))
    template = ServeConfig(
        model=str(ensure_tiny_model(engine=install)), port=0, served_model_name="tiny-llama",
        max_loras=1, max_lora_rank=16, max_cpu_loras=len(ADAPTERS), lora_modules=modules,
    )  # fmt: skip
    cfgs = replica_configs(template, 1)
    try:
        procs = start_engines("vllm", cfgs, install=install)
    except ProcessError as exc:
        pytest.fail(f"vllm did not start: {exc}", pytrace=False)
    try:
        url = cfgs[0].url
        with urllib.request.urlopen(f"{url}/version", timeout=10) as resp:
            version = json.loads(resp.read())["version"]
        labels_seen: list[dict[str, str]] = []

        def scrape() -> Sample:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
                page = resp.read().decode()
            labels_seen.append(latest_labels(page, "vllm:lora_requests_info") or {})
            return Sample.of(parse_metrics(page, version))

        samples: list[tuple[float, Sample]] = [(time.monotonic(), scrape())]
        done = threading.Event()

        def sampler() -> None:
            while not done.is_set():
                samples.append((time.monotonic(), scrape()))
                done.wait(0.1)

        thread = threading.Thread(target=sampler, name="sampler")
        thread.start()
        try:
            with ThreadPoolExecutor(max_workers=6) as pool:
                statuses = list(pool.map(lambda m: _complete(url, m), [*ADAPTERS, *ADAPTERS]))
        finally:
            done.set()
            thread.join(timeout=30)
        samples.append((time.monotonic(), scrape()))
    finally:
        stop_engines(procs)
    assert statuses == [200] * 6
    row = family_of(version)
    assert version == install.version and row is not None and row.name == "0.32", version
    # the measured contents: one list, the same in both labels, never more than the one slot's adapter
    lists = [(lb["running_lora_adapters"], lb["waiting_lora_adapters"]) for lb in labels_seen if lb]
    assert lists and all(run == wait and "," not in run for run, wait in lists), sorted(set(lists))
    assert {run for run, _ in lists} >= set(ADAPTERS), sorted(set(lists))
    times = [t for t, _ in samples]
    dt = [0.0, *(b - a for a, b in itertools.pairwise(times))]
    obs = summarize([s for _, s in samples], dt, window_s=times[-1] - times[0], end=times[-1])
    assert obs.max_loras == 1
    assert obs.distinct_max == 1, obs  # censored: the two adapters whose requests wait are not listed
    # the first batch: one adapter's two requests run, the other four wait, and only it is listed
    assert any(s.waiting >= 4 and len(s.inflight) == 1 for _, s in samples), [s for _, s in samples]
    assert obs.slot_wait_s > 0, obs  # requests waited with the one slot busy and KV cache free
    assert obs.finished == 6 and obs.ttft_p99_s is not None and obs.ttft_p99_s > 0, obs
    assert all(not s.waiting_only for _, s in samples)  # vLLM 0.32: both labels list the same names
    assert set(obs.adapters) == set(ADAPTERS) and obs.kv_usage_max < 0.9
    # the direction at small scale: one slot for three busy adapters -> grow
    bounds = SlotBounds(current=1, max_slots=8, n_adapters=3, slot_bytes=1, kv_per_token_bytes=1)
    rec = recommend(pool_evidence([replace(obs, samples=max(obs.samples, MIN_SAMPLES))]), bounds)
    assert rec.action == Action.GROW and rec.max_loras >= 2, rec.evidence
