"""The pure engine: vLLM's admission rule, LRU slots and caches, stalls, step time, KV limits."""

from __future__ import annotations

import random
import statistics

import pytest

from lorapool.sim.engine import (
    FINISHED,
    RUNNING,
    AdapterRef,
    Engine,
    EngineConfig,
    LoadEvent,
    SimRequest,
    run_workload,
)
from lorapool.sim.timing import TimingParams

T = TimingParams()
ADAPTERS = {name: AdapterRef(i + 1, name, 16, f"/adapters/{name}") for i, name in enumerate("ABCDEFGHIJKLMNOP")}


def make_engine(**overrides: object) -> Engine:
    config: dict[str, object] = {"num_gpu_blocks": 100_000, "enable_lora": True, "max_loras": 1}
    config.update(overrides)
    return Engine(EngineConfig(**config), T)  # type: ignore[arg-type]


def make_request(rid: str, adapter: str | None = None, prompt: int = 8, out: int = 4) -> SimRequest:
    return SimRequest(rid, prompt, out, "length", ADAPTERS[adapter] if adapter else None)


def run_to_completion(engine: Engine, max_steps: int = 100_000) -> list[LoadEvent]:
    loads: list[LoadEvent] = []
    for _ in range(max_steps):
        if not engine.has_work:
            return loads
        loads.extend(engine.step().loads)
    raise AssertionError("engine did not finish")


# -- the max-loras admission rule -------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_loras", "running", "waiting", "admitted", "left_waiting"),
    [
        pytest.param(
            1, ["A"], ["B", "A", None, "B"], ["A", None], ["B", "B"], id="one-slot-skips-other-adapters-keeps-order"
        ),
        pytest.param(2, ["A"], ["B", "C", "A"], ["B", "A"], ["C"], id="two-slots-third-adapter-waits"),
        pytest.param(2, [], ["A", "B", "C", "A", "B"], ["A", "B", "A", "B"], ["C"], id="later-requests-overtake"),
        pytest.param(1, [], ["C", "A", "C"], ["C", "C"], ["A"], id="head-adapter-wins-slot"),
        pytest.param(1, ["A"], [None, None], [None, None], [], id="base-model-never-blocked"),
        pytest.param(3, ["A", "B"], ["C", "D", "A"], ["C", "A"], ["D"], id="fills-remaining-slot-only"),
    ],
)
def test_max_loras_admission(
    max_loras: int,
    running: list[str | None],
    waiting: list[str | None],
    admitted: list[str | None],
    left_waiting: list[str | None],
) -> None:
    engine = make_engine(max_loras=max_loras, max_cpu_loras=16)
    for i, adapter in enumerate(running):
        engine.add_request(make_request(f"r{i}", adapter, out=100))
    engine.step()
    assert engine.num_running == len(running)
    queued = [make_request(f"w{i}", adapter, out=100) for i, adapter in enumerate(waiting)]
    for req in queued:
        engine.add_request(req)
    engine.step()
    got = [r.adapter.name if r.adapter else None for r in queued if r.state == RUNNING]
    assert got == admitted
    assert [r.adapter.name if r.adapter else None for r in engine.waiting] == left_waiting
    assert len({r.adapter.lora_id for r in engine.running if r.adapter}) <= max_loras


def test_a_busy_adapter_starves_another_with_one_slot() -> None:
    engine = make_engine(max_loras=1)
    for i in range(3):
        engine.add_request(make_request(f"a{i}", "A", out=50))
    blocked = make_request("b", "B", out=5)
    engine.add_request(blocked)
    for step in range(60):
        engine.step()
        if step % 10 == 0:  # A's traffic keeps arriving
            engine.add_request(make_request(f"late{step}", "A", out=50))
        if step < 49:
            assert blocked.state != RUNNING, f"B admitted at step {step} while A still ran"
    run_to_completion(engine)
    assert blocked.state == FINISHED


# -- GPU slots and CPU cache ------------------------------------------------------------------


def test_lru_eviction_order_of_slots_and_cpu_cache() -> None:
    engine = make_engine(max_loras=2, max_cpu_loras=3)
    expected = [
        ("A", "disk", True, ("A",), ("A",)),
        ("B", "disk", True, ("A", "B"), ("A", "B")),
        ("C", "disk", True, ("B", "C"), ("A", "B", "C")),
        ("A", "cpu", False, ("C", "A"), ("B", "C", "A")),
        ("D", "disk", True, ("A", "D"), ("C", "A", "D")),  # B leaves the CPU cache: oldest
        ("B", "disk", False, ("D", "B"), ("A", "D", "B")),  # read before: warm page cache
        ("D", None, None, ("B", "D"), ("A", "B", "D")),  # resident: no load, just touched
    ]
    for adapter, source, cold, gpu, cpu in expected:
        engine.add_request(make_request(f"req-{adapter}", adapter))
        loads = run_to_completion(engine)
        if source is None:
            assert loads == []
        else:
            assert [(e.adapter, e.source, e.cold) for e in loads] == [(adapter, source, cold)]
        assert engine.gpu_adapters() == gpu
        assert engine.cpu_adapters() == cpu


def test_adapters_of_the_same_batch_never_evict_each_other() -> None:
    engine = make_engine(max_loras=2, max_cpu_loras=2)
    for name in ("A", "B"):
        engine.add_request(make_request(name, name, out=3))
    result = engine.step()
    assert sorted(e.adapter for e in result.loads) == ["A", "B"]
    assert sorted(engine.gpu_adapters()) == ["A", "B"]
    run_to_completion(engine)
    engine.add_request(make_request("c", "C"))
    engine.add_request(make_request("b", "B"))
    result = engine.step()
    assert [e.adapter for e in result.loads] == ["C"]
    assert set(engine.gpu_adapters()) == {"B", "C"}
    assert set(engine.cpu_adapters()) == {"B", "C"}


# -- stalls -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "expected_stall"),
    [
        pytest.param("cold", T.disk_load_s(16, cold=True) + T.gpu_load_s(16), id="first-read-from-disk"),
        pytest.param("warm-disk", T.disk_load_s(16, cold=False) + T.gpu_load_s(16), id="evicted-from-cpu-cache"),
        pytest.param("cpu", T.gpu_load_s(16), id="in-cpu-cache-not-in-slot"),
        pytest.param("resident", 0.0, id="already-in-slot"),
    ],
)
def test_a_slot_miss_stalls_the_whole_step(setup: str, expected_stall: float) -> None:
    engine = make_engine(max_loras=1, max_cpu_loras=1 if setup == "warm-disk" else 2)
    if setup in ("warm-disk", "cpu", "resident"):
        engine.add_request(make_request("first", "A"))
        run_to_completion(engine)
    if setup in ("warm-disk", "cpu"):
        engine.add_request(make_request("other", "B"))
        run_to_completion(engine)
    engine.add_request(make_request("base", None, out=10))
    engine.step()  # a base-model request already running: it waits for the load too
    engine.add_request(make_request("x", "A"))
    result = engine.step()
    assert result.stall_s == pytest.approx(expected_stall)
    assert result.num_seqs == 2
    assert result.duration_s == pytest.approx(result.forward_s + expected_stall)
    assert result.forward_s == pytest.approx(T.forward_s(2, 8, 1))


def test_stall_counters_add_up() -> None:
    engine = make_engine(max_loras=1, max_cpu_loras=2)
    total = 0.0
    for name in ("A", "B", "A", "B"):
        engine.add_request(make_request(name, name))
        loads = run_to_completion(engine)
        total += sum(e.seconds for e in loads)
    assert engine.stats.stall_s == pytest.approx(total)
    assert engine.stats.loads == {"disk": 2, "cpu": 2}
    assert engine.stats.cold_loads == 2


def test_load_adapter_utility_reads_disk_then_hits_cache() -> None:
    engine = make_engine(max_loras=1, max_cpu_loras=2)
    first = engine.load_adapter(ADAPTERS["A"])
    assert (first.source, first.cold) == ("disk", True)
    assert first.seconds == pytest.approx(T.disk_load_s(16, cold=True) + T.gpu_load_s(16))
    again = engine.load_adapter(ADAPTERS["A"])
    assert again.seconds == 0.0
    inplace = engine.load_adapter(ADAPTERS["A"], replace=True)  # load_inplace re-reads, warm
    assert (inplace.source, inplace.cold) == ("disk", False)
    engine.add_request(make_request("a", "A"))
    assert engine.step().loads == ()  # the load call left it in a slot


# -- step time --------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 8, 32, 64])
def test_decode_step_time_grows_with_batch_size(batch: int) -> None:
    engine = make_engine(enable_lora=False)
    for i in range(batch):
        engine.add_request(make_request(f"r{i}", None, out=10))
    engine.step()  # prefill
    result = engine.step()
    assert result.num_seqs == batch
    assert result.duration_s == pytest.approx(T.decode_step_s(batch))


@pytest.mark.parametrize("distinct", [1, 2, 4, 8])
def test_step_time_grows_with_distinct_adapters(distinct: int) -> None:
    engine = make_engine(max_loras=8, max_cpu_loras=8)
    names = list("ABCDEFGH")
    for i in range(8):
        engine.add_request(make_request(f"r{i}", names[i % distinct], out=10))
    engine.step()  # prefill and loads
    result = engine.step()
    assert result.stall_s == 0.0
    assert result.duration_s == pytest.approx(T.decode_step_s(8) * (1 + T.lora_overhead(distinct)))


# -- batching limits and KV cache -------------------------------------------------------------


def test_max_num_seqs_caps_the_batch() -> None:
    engine = make_engine(enable_lora=False, max_num_seqs=2)
    for i in range(5):
        engine.add_request(make_request(f"r{i}", None))
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 3)


def test_chunked_prefill_spends_the_token_budget() -> None:
    engine = make_engine(enable_lora=False, max_num_batched_tokens=100)
    req = make_request("long", None, prompt=250, out=3)
    engine.add_request(req)
    chunks = [engine.step() for _ in range(3)]
    assert [c.prefill_tokens for c in chunks] == [100, 100, 50]
    assert [len(c.emitted) for c in chunks] == [0, 0, 1]  # the first token ends the prefill


def test_kv_cache_limits_admission_and_reports_usage() -> None:
    engine = make_engine(enable_lora=False, num_gpu_blocks=10, block_size=16, max_model_len=160)
    reqs = [make_request(f"r{i}", None, prompt=64, out=4) for i in range(3)]
    for req in reqs:
        engine.add_request(req)
    engine.step()
    assert [r.state for r in reqs] == [RUNNING, RUNNING, 0]  # 4 + 4 blocks used, 2 left < 4
    assert engine.kv_cache_usage == pytest.approx(0.8)
    run_to_completion(engine)
    assert engine.kv_cache_usage == 0.0
    assert all(r.generated == 4 for r in reqs)


def test_running_out_of_kv_preempts_the_newest_request() -> None:
    engine = make_engine(enable_lora=False, num_gpu_blocks=10, block_size=16, max_model_len=160)
    old = make_request("old", None, prompt=64, out=60)
    new = make_request("new", None, prompt=64, out=60)
    engine.add_request(old)
    engine.add_request(new)
    preempted = 0
    while old.state != FINISHED:
        preempted += engine.step().preempted
    assert preempted >= 1
    assert new.num_preemptions >= 1 and old.num_preemptions == 0
    run_to_completion(engine)
    assert (old.generated, new.generated) == (60, 60)
    assert engine.stats.preemptions == new.num_preemptions
    assert engine.kv_cache_usage == 0.0


def test_abort_frees_blocks_and_counts() -> None:
    engine = make_engine(enable_lora=True, max_loras=1)
    running = make_request("run", "A", out=50)
    waiting = make_request("wait", "B", out=50)
    engine.add_request(running)
    engine.add_request(waiting)
    engine.step()
    assert engine.running_adapter_names() == ("A",)
    assert engine.waiting_adapter_names() == ("B",)
    assert engine.listed_adapter_names() == ("A",)  # as vLLM's lora_requests_info: B only waits
    assert engine.abort(running) and engine.abort(waiting)
    assert not engine.abort(running)
    assert engine.kv_cache_usage == 0.0
    assert not engine.has_work
    assert engine.stats.finished["abort"] == 2
    assert engine.running_adapter_names() == () == engine.waiting_adapter_names() == engine.listed_adapter_names()


def test_listed_adapters_follow_first_tokens_and_ends_as_vllm_lists_them() -> None:
    """vLLM (0.32, 0.34) lists an adapter from its first request's first token to its last
    request's end; a request still in a prefill chunk, or only waiting, is not listed."""
    engine = make_engine(enable_lora=True, max_loras=1, max_num_batched_tokens=16)
    first = make_request("a1", "A", prompt=40, out=3)  # a 40-token prompt: three 16-token chunks
    engine.add_request(first)
    engine.add_request(make_request("b1", "B", out=2))
    engine.step()
    assert (engine.running_adapter_names(), engine.listed_adapter_names()) == (("A",), ())  # a prefill chunk
    while first.first_token_s < 0:
        engine.step()
    assert engine.listed_adapter_names() == ("A",)  # B waits for the slot: not listed
    while first.generated < 3:
        engine.step()
    assert engine.listed_adapter_names() == ()  # A ended; B has not had its first token yet
    run_to_completion(engine)
    assert engine.listed_adapter_names() == ()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param({"max_lora_rank": 24}, "not one of vLLM's ranks", id="rank-not-allowed"),
        pytest.param({"max_loras": 4, "max_cpu_loras": 2}, "must be >= --max-loras", id="cpu-below-gpu"),
        pytest.param({"num_gpu_blocks": 10, "max_model_len": 8192}, "fewer than --max-model-len", id="kv-too-small"),
        pytest.param({"max_loras": 0}, "must be >= 1", id="no-slots"),
    ],
)
def test_vllm_startup_checks(config: dict[str, object], message: str) -> None:
    params: dict[str, object] = {"num_gpu_blocks": 100_000}
    params.update(config)
    with pytest.raises(ValueError, match=message):
        EngineConfig(**params)  # type: ignore[arg-type]


# -- whole workloads on the virtual clock -----------------------------------------------------


def poisson_workload(seed: int, adapters: int, rate_per_s: float, count: int) -> list[tuple[float, SimRequest]]:
    rng = random.Random(seed)
    names = list(ADAPTERS)[:adapters]
    t = 0.0
    out = []
    for i in range(count):
        t += rng.expovariate(rate_per_s)
        out.append((t, make_request(f"r{i}", rng.choice(names), prompt=rng.randint(8, 512), out=rng.randint(8, 256))))
    return out


def test_deterministic_under_the_same_seed() -> None:
    def run(seed: int) -> tuple[list[tuple[float, int]], list[float]]:
        engine = make_engine(max_loras=4, max_cpu_loras=8)
        workload = poisson_workload(seed, adapters=12, rate_per_s=20, count=150)
        steps = run_workload(engine, workload)
        return [(s.duration_s, s.num_seqs) for s in steps], [r.first_token_s for _, r in workload]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_slot_cliff_when_adapters_outnumber_max_loras() -> None:
    """SGLang, 8 slots: median TTFT 40 ms with 8 adapters, 6.3 s with 16 (FIELD-NOTES)."""

    def median_ttft(adapters: int) -> float:
        engine = make_engine(max_loras=8, max_cpu_loras=16)
        workload = poisson_workload(1, adapters=adapters, rate_per_s=12, count=300)
        run_workload(engine, workload)
        return statistics.median(r.first_token_s - r.arrival_s for _, r in workload)

    fits, overflows = median_ttft(8), median_ttft(16)
    assert fits < 0.2
    assert overflows > 5 * fits
