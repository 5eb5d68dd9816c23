"""Routing by the sidecars' reports: the pure decision (``reports``) and the scheduler that acts on it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from lorapool.api.pods import EnginePod, engine_pod
from lorapool.api.report import ANNOTATION, AdapterReport, ReplicaReport, encode
from lorapool.api.report import ReplicaPhase as P
from lorapool.api.vllm_metrics import VllmMetrics
from lorapool.router.core import registry
from lorapool.router.core.admission import RefusalReason
from lorapool.router.core.backend import Request
from lorapool.router.core.discovery import backend_targets
from lorapool.router.core.reports import Standing, backend_reports, served, standing
from lorapool.router.core.state import BackendState
from lorapool.router.podreports import parse_backend_pod, parse_pods_target
from lorapool.router.scheduler import Lease, Refused, Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry
from lorapool_dev.testing.wait import wait_until_async

NEW, OLD = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
RANK_ERROR = "Call to add_lora method failed: LoRA rank 64 is greater than max_lora_rank 16."


def report(**adapters: AdapterReport) -> ReplicaReport:
    return ReplicaReport(engine_healthy=True, adapters=adapters)


LOADED = AdapterReport(P.LOADED, NEW, NEW)
SWAPPING = AdapterReport(P.DOWNLOADING, NEW, OLD)  # hot swap under way: the old revision still serves
DOWNLOADING = AdapterReport(P.DOWNLOADING, NEW)
FAILED = AdapterReport(P.FAILED, NEW, message=RANK_ERROR)
FAILED_KEEPS_OLD = AdapterReport(P.FAILED, NEW, OLD, message=RANK_ERROR)
UNLOADING = AdapterReport(P.UNLOADING, None, NEW)


@dataclass(frozen=True)
class Case:
    reports: dict[str, ReplicaReport | None]
    standing: Standing
    loaded_on: tuple[str, ...] = ()
    reason: str = ""  # a part of the 404's message


CASES = {
    "loaded-on-one-of-two": Case({"a": report(sql=LOADED), "b": report()}, Standing.LOADED, ("a",)),
    "loaded-on-both": Case({"a": report(sql=LOADED), "b": report(sql=LOADED)}, Standing.LOADED, ("a", "b")),
    "old-revision-serves-during-a-swap": Case({"a": report(sql=SWAPPING)}, Standing.LOADED, ("a",)),
    "failed-swap-keeps-serving-the-old": Case({"a": report(sql=FAILED_KEEPS_OLD)}, Standing.LOADED, ("a",)),
    "loaded-here-failed-there": Case({"a": report(sql=FAILED), "b": report(sql=LOADED)}, Standing.LOADED, ("b",)),
    "loading-somewhere": Case({"a": report(sql=DOWNLOADING), "b": report()}, Standing.LOADING),
    "loading-here-failed-there": Case({"a": report(sql=FAILED), "b": report(sql=DOWNLOADING)}, Standing.LOADING),
    "failed-everywhere": Case(
        {"a": report(sql=FAILED), "b": report(sql=FAILED)}, Standing.FAILED, reason="failed to load on 2 replica(s)"
    ),
    "failed-says-the-engine-reason": Case({"a": report(sql=FAILED)}, Standing.FAILED, reason=RANK_ERROR),
    "unknown-to-every-report": Case(
        {"a": report(chat=LOADED), "b": report()}, Standing.UNKNOWN, reason="not in the pool's adapter set"
    ),
    "being-unloaded": Case({"a": report(sql=UNLOADING)}, Standing.UNKNOWN, reason="being removed"),
    "no-report-anywhere": Case({"a": None, "b": None}, Standing.UNREPORTED),
    "no-backends": Case({}, Standing.UNREPORTED),
    "one-reports-the-other-not": Case({"a": None, "b": report(sql=LOADED)}, Standing.LOADED, ("b",)),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_standing(case: Case) -> None:
    verdict = standing("sql", case.reports)
    assert verdict.standing == case.standing
    assert verdict.loaded_on == case.loaded_on
    assert case.reason in verdict.reason
    if case.standing in (Standing.FAILED, Standing.UNKNOWN):
        assert "sql" in verdict.reason and "does not exist" not in verdict.reason


def test_served_is_what_the_engine_holds_by_name() -> None:
    r = report(sql=LOADED, chat=SWAPPING, code=DOWNLOADING, math=FAILED, old=UNLOADING, kept=FAILED_KEEPS_OLD)
    assert served(r) == {"sql", "chat", "kept"}


def pod(name: str, ip: str | None, *, ready: bool = True, deleting: bool = False, text: str | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "annotations": {ANNOTATION: text} if text else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


GOOD = encode(report(sql=LOADED))


@pytest.mark.parametrize(
    ("obj", "usable"),
    [
        pytest.param(pod("p", "10.0.0.1", text=GOOD), True, id="ready-with-report"),
        pytest.param(pod("p", "10.0.0.1", ready=False, text=GOOD), False, id="not-ready"),
        pytest.param(pod("p", "10.0.0.1", deleting=True, text=GOOD), False, id="terminating"),
        pytest.param(pod("p", "10.0.0.1"), False, id="no-annotation"),
        pytest.param(pod("p", "10.0.0.1", text='{"v": 99}'), False, id="newer-format"),
        pytest.param(pod("p", "10.0.0.1", text="{not json"), False, id="broken"),
        pytest.param({"metadata": {"name": "p"}}, False, id="no-status"),
    ],
)
def test_pod_facts_trust_only_ready_live_pods(obj: dict, usable: bool) -> None:
    facts = engine_pod(obj)
    assert facts.name == "p"
    assert (facts.usable is not None) == usable
    if usable:
        assert facts.usable is not None and served(facts.usable) == {"sql"}


def test_backends_find_their_pods_by_name_else_by_ip() -> None:
    r1, r2, r3 = report(sql=LOADED), report(chat=LOADED), report(code=LOADED)
    pods = {
        "e-0": EnginePod("e-0", ip="10.0.0.1", ready=True, report=r1),
        "e-1": EnginePod("e-1", ip="10.0.0.2", ready=True, report=r2),
        "e-2": EnginePod("e-2", ip="10.0.0.3", ready=False, report=r3),  # not ready: its report is not trusted
    }
    found = backend_reports(
        ["http://127.0.0.1:8001", "http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.9.9.9:8000"],
        pods,
        {"http://127.0.0.1:8001": "e-0"},
    )
    assert found == {
        "http://127.0.0.1:8001": r1,  # named (--backend-pod / targetRef)
        "http://10.0.0.2:8000": r2,  # matched by pod IP
        "http://10.0.0.3:8000": None,
        "http://10.9.9.9:8000": None,  # no such pod
    }


def test_endpointslice_targets_name_the_pods() -> None:
    slice_ = {
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "targetRef": {"kind": "Pod", "name": "e-0"}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": False}, "targetRef": {"kind": "Pod", "name": "e-1"}},
            {"addresses": ["10.0.0.3"]},
        ],
    }
    assert backend_targets([slice_]) == {"http://10.0.0.1:8000": "e-0"}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("ml/lorapool.io/pool=p,app.kubernetes.io/component=engine", None),
        ("ml", "NAMESPACE/LABEL_SELECTOR"),
        ("/x=y", "NAMESPACE/LABEL_SELECTOR"),
    ],
)
def test_report_pods_flag(value: str, error: str | None) -> None:
    if error is None:
        assert parse_pods_target(value) == ("ml", "lorapool.io/pool=p,app.kubernetes.io/component=engine")
    else:
        with pytest.raises(ValueError, match=error):
            parse_pods_target(value)


def test_backend_pod_flag() -> None:
    assert parse_backend_pod("http://127.0.0.1:8001/=e-0") == ("http://127.0.0.1:8001", "e-0")
    for bad in ("e-0", "http://127.0.0.1:8001=", "127.0.0.1:8001=e-0"):
        with pytest.raises(ValueError, match="URL=POD"):
            parse_backend_pod(bad)


def test_a_report_overrides_v1_models_and_a_404_is_forgotten_at_the_next_report() -> None:
    state = BackendState("http://a")
    state.apply_models([{"id": "base"}, {"id": "sql", "parent": "base"}])
    assert state.served_models() == {"base", "sql"}
    state.apply_report(report(chat=LOADED, code=DOWNLOADING))
    assert state.served_models() == {"base", "chat"}  # the report, plus the base model /v1/models lists
    state.forget_model("chat")  # the engine answered 404 for it
    assert not state.serves("chat")
    state.apply_report(report(chat=LOADED, code=LOADED))
    assert state.served_models() == {"base", "chat", "code"}
    state.apply_report(None)  # the pod's report went away: /v1/models decides again
    assert state.served_models() == {"base", "sql"}


# --- the scheduler acting on the decision (no network: states are set by hand) -----------------


@dataclass
class Pool:
    """A scheduler over two backends, up and polled, with reports as given."""

    reports: dict[str, ReplicaReport | None]
    models: tuple[str, ...] = ("base",)
    max_wait_s: float = 0.2
    policy: str = "affinity"
    scheduler: Scheduler = field(init=False)

    def __post_init__(self) -> None:
        settings = RouterSettings(max_wait_s=self.max_wait_s, max_loras=4)
        self.scheduler = Scheduler(registry.build(self.policy), settings, Telemetry())
        self.scheduler.set_backends(["http://a", "http://b"])
        cards = [{"id": "base"}, *({"id": m, "parent": "base"} for m in self.models if m != "base")]
        for backend in self.scheduler.backends():
            self.scheduler.polled(backend, VllmMetrics(), cards)
        self.scheduler.set_reports(self.reports)


async def outcome(pool: Pool, model: str = "sql") -> str:
    """Where the request went, or the answer it got: 'http://a', '404: <reason>', '503: <reason>'."""
    try:
        lease = await pool.scheduler.acquire(pool.scheduler.request_for(model))
    except Refused as exc:
        if exc.refusal.status == 404:
            return f"404: {exc.refusal.detail or 'generic'}"
        if exc.refusal.reason == RefusalReason.STILL_LOADING:
            return f"503: {exc.refusal.detail}"
        raise
    pool.scheduler.release(lease)
    return lease.backend


A, B = "http://a", "http://b"
ROUTING = {
    "only-where-loaded": ({A: report(), B: report(sql=LOADED)}, (), "sql", B),
    "reports-beat-a-stale-v1-models": ({A: report(), B: report(sql=LOADED)}, ("sql",), "sql", B),
    "loading-waits-then-503": ({A: report(sql=DOWNLOADING), B: report()}, (), "sql", "503: adapter 'sql' is loading on 1 replica(s)"),
    "failed-404-with-the-engine-reason": ({A: report(sql=FAILED), B: report(sql=FAILED)}, ("sql",), "sql", f"404: adapter 'sql' failed to load on 2 replica(s): {RANK_ERROR}"),
    "unknown-404-not-in-the-pool": ({A: report(), B: report()}, (), "sql", "404: adapter 'sql' is not in the pool's adapter set"),
    "no-reports-v1-models-decides": ({}, ("sql",), "sql", f"{A}|{B}"),
    "no-reports-and-not-listed-generic-404": ({}, (), "sql", "404: generic"),
    "base-model-needs-no-report": ({A: report(), B: report()}, (), "base", f"{A}|{B}"),
}  # fmt: skip


@pytest.mark.parametrize(("reports", "models", "model", "expected"), list(ROUTING.values()), ids=list(ROUTING))
def test_the_scheduler_routes_by_reports(
    reports: dict[str, ReplicaReport | None], models: tuple[str, ...], model: str, expected: str
) -> None:
    got = asyncio.run(outcome(Pool(reports, ("base", *models)), model))
    if "|" in expected:
        assert got in expected.split("|")
    else:
        assert got.startswith(expected), got


async def held(pool: Pool, adapter: str) -> None:
    """Until one request waits in the adapter's queue: the state the test goes on from."""
    await wait_until_async(f"a request held for {adapter}", lambda: pool.scheduler.queues.depth(adapter) == 1, 5)


@pytest.mark.parametrize("policy", ["affinity", "round-robin"])
def test_a_held_request_binds_as_soon_as_a_report_says_loaded(policy: str) -> None:
    async def run() -> tuple[str, float, Any]:
        pool = Pool({A: report(sql=DOWNLOADING), B: report()}, max_wait_s=10, policy=policy)
        started = time.monotonic()
        waiting = asyncio.create_task(pool.scheduler.acquire(Request("sql")))
        await held(pool, "sql")
        assert not waiting.done()
        pool.scheduler.set_reports({A: report(sql=LOADED), B: report()})
        lease: Lease = await waiting
        pool.scheduler.release(lease)
        return lease.backend, time.monotonic() - started, pool.scheduler.telemetry

    where, waited_s, telemetry = asyncio.run(run())
    assert where == A and waited_s < 5
    page = telemetry.exposition().decode()
    assert 'lorapool_router_adapter_requests_total{adapter="sql",result="miss"} 1.0' in page
    assert 'lorapool_router_queue_wait_seconds_count{reason="load"} 1.0' in page


def test_an_adapter_held_only_by_a_down_replica_is_503_not_404() -> None:
    async def run() -> str:
        pool = Pool({A: report(sql=LOADED), B: report()})
        backend = pool.scheduler.backend(A)
        assert backend is not None
        pool.scheduler.mark_down(backend, "connection refused")
        try:
            await pool.scheduler.acquire(Request("sql"))
        except Refused as exc:
            assert exc.refusal.status == 503
            return str(exc)
        return "bound"

    assert "loaded only on replicas that are down" in asyncio.run(run())


def test_a_held_request_gets_404_as_soon_as_the_load_fails() -> None:
    async def run() -> tuple[str, float]:
        pool = Pool({A: report(sql=DOWNLOADING), B: report()}, max_wait_s=10)
        started = time.monotonic()
        waiting = asyncio.create_task(outcome(pool))
        await held(pool, "sql")
        pool.scheduler.set_reports({A: report(sql=FAILED), B: report()})
        return await waiting, time.monotonic() - started

    got, waited_s = asyncio.run(run())
    assert got == f"404: adapter 'sql' failed to load on 1 replica(s): {RANK_ERROR}" and waited_s < 5


def test_hit_miss_and_loads_per_adapter() -> None:
    async def run() -> str:
        pool = Pool({A: report(sql=LOADED), B: report()})
        first = await pool.scheduler.acquire(Request("sql"))  # not in a slot yet: a miss, one slot load
        second = await pool.scheduler.acquire(Request("sql"))  # in flight there: a hit
        pool.scheduler.release(first)
        pool.scheduler.release(second)
        third = await pool.scheduler.acquire(Request("sql"))  # recently run there: still a hit
        pool.scheduler.release(third)
        return pool.scheduler.telemetry.exposition().decode()

    page = asyncio.run(run())
    assert 'lorapool_router_adapter_requests_total{adapter="sql",result="hit"} 2.0' in page
    assert 'lorapool_router_adapter_requests_total{adapter="sql",result="miss"} 1.0' in page
    assert 'lorapool_router_adapter_loads_total{adapter="sql"} 1.0' in page


def test_adapter_labels_are_capped() -> None:
    telemetry = Telemetry(max_model_labels=2)
    for name in ("a", "b", "c", "d"):
        telemetry.routed(name, hit=False, slot_load=True)
    page = telemetry.exposition().decode()
    assert 'adapter="a"' in page and 'adapter="b"' in page
    assert 'lorapool_router_adapter_loads_total{adapter="other"} 2.0' in page
    assert 'adapter="c"' not in page


def test_docs_status_names_the_real_flags_metrics_and_messages() -> None:
    """docs/status.md section 5 says what the router does: its flags, metric names and 404 texts are the code's."""
    import argparse
    import re
    from pathlib import Path

    from lorapool.router.cli import configure

    doc = (Path(__file__).resolve().parents[2] / "docs" / "status.md").read_text()
    section = doc[doc.index("## 5. The router routes by it") : doc.index("## 6.")]
    parser = argparse.ArgumentParser()
    configure(parser)
    flags = {s for a in parser._actions for s in a.option_strings}
    assert set(re.findall(r"(--[a-z-]+[a-z])", section)) <= flags
    telemetry = Telemetry()
    telemetry.watch(lambda: [BackendState("http://a")], dict)
    telemetry.routed("sql", hit=False, slot_load=True)
    telemetry.held("sql", "load", 0.1)
    page = telemetry.exposition().decode()
    named = set(re.findall(r"`(lorapool_router_[a-z_]+)", section))
    exported = set(re.findall(r"^([a-z_]+)[{ ]", page, re.M)) | set(re.findall(r"^# TYPE ([a-z_]+) ", page, re.M))
    assert named and named <= exported, named - exported
    unknown = standing("a", {"x": report()}).reason
    assert unknown in section.replace("`", "'") or unknown.replace("'", "") in section.replace("`", "")


def test_reports_are_forgotten_when_the_pod_watch_keeps_failing() -> None:
    """A watch that cannot list (API down, rights revoked) must not leave stale reports in charge:
    after FORGET_AFTER_FAILURES failures the router gets an empty snapshot, so /v1/models decides."""
    from kubernetes.client.rest import ApiException

    from lorapool.router.kubewatch import ListWatch
    from lorapool.router.podreports import FORGET_AFTER_FAILURES

    calls: list[str] = []

    def list_call(api: Any) -> Any:
        def refused(namespace: str, **_: Any) -> Any:
            calls.append(namespace)
            raise ApiException(status=403, reason="Forbidden")

        return refused

    async def run() -> list[dict[str, Any]]:
        published: list[dict[str, Any]] = []
        got = asyncio.Event()

        def publish(items: dict[str, Any]) -> None:
            published.append(items)
            got.set()

        watch = ListWatch("Pods", list_call, "ns", "a=b", engine_pod, publish, asyncio.get_running_loop(),
                          api_client=object(), forget_after_failures=FORGET_AFTER_FAILURES)  # fmt: skip
        watch.start()
        try:
            await asyncio.wait_for(got.wait(), 20)
        finally:
            watch.stop()
            await asyncio.to_thread(watch.join, 10)
        return published

    assert asyncio.run(run()) == [{}]
    assert len(calls) >= FORGET_AFTER_FAILURES
