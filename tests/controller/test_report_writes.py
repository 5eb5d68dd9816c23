"""How many API writes the report channel costs: 1,000 adapters x 16 replicas (issue 10).

Sixteen real ``Reporter``s (the sidecar's writer: same pacing, same PATCH of pods/status)
report on sixteen real Pods of the local control plane. Their engines are simulated: each
replica walks its 1,000 adapters Pending -> Downloading -> Verifying -> Loading -> Loaded in
~30 s, building the report with the sidecar's own ``replica_report``. Measured: the API
server's own count of pods/status PATCHes while loading and while idle.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lorapool.api.adapterset import DesiredAdapter
from lorapool.api.report import ANNOTATION, SYNCED_CONDITION, encode
from lorapool.podstatus import PodRef, api_server
from lorapool.sidecar.core import AdapterState, Phase, identity_of
from lorapool.sidecar.podreport import replica_report, synced_condition
from lorapool.sidecar.reporter import Reporter
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until, wait_until_async

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

REPLICAS, ADAPTERS = 16, 1000
LOADING_S, IDLE_S, TICK_S = 30.0, 15.0, 0.1
MIN_INTERVAL_S = 2.0  # the sidecar's --report-interval-seconds default
STEPS = (Phase.PENDING, Phase.DOWNLOADING, Phase.VERIFYING, Phase.LOADING, Phase.LOADED)


class SimulatedEngine:
    """One replica's adapter states, moved forward a few per tick as a sidecar would."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.desired = {
            f"adapter-{i:04d}": DesiredAdapter(name=f"adapter-{i:04d}", source=f"file:///adapters/{i}")
            for i in range(ADAPTERS)
        }
        self.state = {n: AdapterState(n) for n in self.desired}
        self.per_tick = round(ADAPTERS * (len(STEPS) - 1) / (LOADING_S / TICK_S)) + 1

    def tick(self) -> None:
        moving = [n for n, st in self.state.items() if st.phase != Phase.LOADED]
        for name in self.rng.sample(moving, min(self.per_tick, len(moving))):
            st = self.state[name]
            nxt = STEPS[STEPS.index(st.phase) + 1]
            loaded = identity_of(self.desired[name]) if nxt == Phase.LOADED else None
            self.state[name] = replace(st, phase=nxt, loaded=loaded)

    def patch(self) -> dict[str, Any]:
        done = all(st.phase == Phase.LOADED for st in self.state.values())
        synced = synced_condition(done, set(self.desired), self.state)
        report = replica_report(self.desired, self.state, {}, engine_healthy=True)
        condition = {"type": SYNCED_CONDITION, "status": str(synced.status), "reason": synced.reason}
        return {"metadata": {"annotations": {ANNOTATION: encode(report)}}, "status": {"conditions": [condition]}}


def pod_status_patches(cluster: LocalCluster) -> float:
    """The API server's count of PATCHes to pods/status (all clients; nothing else patches these pods)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for line in text.splitlines():
        wanted = ('resource="pods"', 'subresource="status"', 'verb="PATCH"')
        if line.startswith("apiserver_request_total{") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_report_writes_per_minute_for_1000_adapters_on_16_replicas(
    local_cluster: LocalCluster, ns: str, tmp_path: Path
) -> None:
    pods = [f"engine-{i:02d}" for i in range(REPLICAS)]
    manifest = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p, "namespace": ns},
         "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}
        for p in pods
    ]  # fmt: skip
    local_cluster.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifest})
    )
    wait_until(
        "pods running", lambda: local_cluster.kubectl("get", "pods", "-n", ns).stdout.count("Running") == REPLICAS, 60
    )
    server = api_server(local_cluster.kubeconfig)
    engines = [SimulatedEngine(seed=i) for i in range(REPLICAS)]
    reporters = [
        Reporter(server, PodRef(ns, p), e.patch, min_interval_s=MIN_INTERVAL_S)
        for p, e in zip(pods, engines, strict=True)
    ]
    marks: dict[str, float] = {}
    assert not any(r.up_to_date() for r in reporters)  # nothing sent yet

    async def run() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(r.run(stop)) for r in reporters]
        marks["start"], marks["start_api"] = time.monotonic(), pod_status_patches(local_cluster)
        while not all(all(st.phase == Phase.LOADED for st in e.state.values()) for e in engines):
            for e in engines:
                e.tick()
            await asyncio.sleep(TICK_S)
        # The last changes went out (the state the idle count assumes), not a moment that usually follows.
        await wait_until_async(
            "every report sent", lambda: all(r.up_to_date() for r in reporters), 60,
            describe=lambda: [r.last_error for r in reporters],
        )  # fmt: skip
        marks["loaded"], marks["loaded_api"] = (
            time.monotonic(),
            await asyncio.to_thread(pod_status_patches, local_cluster),
        )
        await asyncio.sleep(IDLE_S)
        marks["idle_api"] = await asyncio.to_thread(pod_status_patches, local_cluster)
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())
    loading_min = (marks["loaded"] - marks["start"]) / 60
    loading_writes = marks["loaded_api"] - marks["start_api"]
    idle_writes = marks["idle_api"] - marks["loaded_api"]
    per_min = loading_writes / loading_min
    bound = REPLICAS * 60 / MIN_INTERVAL_S
    print(
        f"\n{ADAPTERS} adapters x {REPLICAS} replicas: {loading_writes:.0f} pods/status writes in "
        f"{loading_min * 60:.0f} s of loading = {per_min:.0f}/min ({per_min / REPLICAS:.1f} per replica per minute; "
        f"pacing bound {bound:.0f}/min); {idle_writes:.0f} writes in {IDLE_S:.0f} s idle; "
        f"report size {len(engines[0].patch()['metadata']['annotations'][ANNOTATION]):,} bytes"
    )
    assert all(r.last_error is None for r in reporters), [r.last_error for r in reporters]
    assert sum(r.writes for r in reporters) >= REPLICAS * 2  # each wrote more than its first report
    assert per_min <= bound * 1.1 and idle_writes == 0
    pod = json.loads(local_cluster.kubectl("get", "pod", pods[0], "-n", ns, "-o", "json").stdout)
    assert json.loads(pod["metadata"]["annotations"][ANNOTATION])["adapters"]["adapter-0999"]["phase"] == "Loaded"
