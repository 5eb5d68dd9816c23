"""A floor under the simulator's own overhead at --time-scale 0 (the router benchmark needs ~500 req/s).

The floors are a fraction of what this 2-core machine measures while other work shares it
(non-streaming ~1 000-2 400 req/s, 16-token streams ~400-650 req/s): they catch a regression of
the per-request path, not noise.
"""

from __future__ import annotations

import asyncio

import pytest

from lorapool_dev.sim.loadgen import run_load
from tests.sim.conftest import Sim, StartSim

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(start_sim: StartSim) -> Sim:
    return start_sim("--time-scale", "0")


@pytest.mark.parametrize(("stream", "floor_req_per_s"), [(False, 150.0), (True, 60.0)])
def test_zero_delay_throughput_floor(sim: Sim, stream: bool, floor_req_per_s: float) -> None:
    base = sim.client().models.list().data[0].id
    result = asyncio.run(run_load(sim.url, requests=1000, concurrency=32, models=[base], max_tokens=16, stream=stream))
    assert result["errors"] == 0
    assert result["req_per_s"] >= floor_req_per_s, result
