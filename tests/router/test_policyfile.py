"""--policy-file: read at start, re-read live, the last good document kept on a bad edit, its hash exported;
the policy flags given beside it override its knobs. The last test runs a real router over a real simulator."""

from __future__ import annotations

import argparse
import http.client
import json
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
from prometheus_client import generate_latest

from lorapool.api.routerpolicy import PolicyState, RouterPolicyDocument, document_hash
from lorapool.router.cli import configure, settings_from
from lorapool.router.core.document import Overrides, SchedulerKnobs
from lorapool.router.core.policy import Scheduling
from lorapool.router.policyfile import PolicyFile, from_flags, read
from lorapool.router.publisher import policy_patch
from lorapool.router.telemetry import Telemetry
from lorapool_dev.testing.wait import wait_until

from .conftest import StartRouter, StartSim

HEAD = '"apiVersion": "lorapool.io/v1alpha1", "kind": "RouterPolicy"'


def canonical(text: str) -> str:
    """A document as the operator writes it (``to_json``), whose hash is that of its bytes."""
    return RouterPolicyDocument.from_json(text).to_json()


AFFINITY = canonical("{" + HEAD + ', "policy": "affinity"}')
PREFIX = canonical("{" + HEAD + ', "policy": "affinity", "weights": {"prefix": 1.5}}')
ROUND_ROBIN = "{" + HEAD + ', "profiles": {"strict": {"filters": ["healthy"], "picker": "round-robin"}}}\n'
TYPO = "{" + HEAD + ', "profiles": {"strict": {"filters": ["healthy", "servs-model"]}}}\n'


def _hash(text: str) -> str:
    return RouterPolicyDocument.from_json(text).hash


def _metrics(telemetry: Telemetry) -> str:
    return generate_latest(telemetry.registry).decode()


def _running(metrics: str) -> list[str]:
    return re.findall(r'^lorapool_router_policy_info\{hash="(\w+)"', metrics, re.M)


class Applied:
    """Stands in for ``Scheduler.set_policy``: what the file applied, in order (the chains, the knobs)."""

    def __init__(self) -> None:
        self.policies: list[Scheduling] = []
        self.knobs: list[SchedulerKnobs] = []

    def __call__(self, scheduling: Scheduling, knobs: SchedulerKnobs) -> None:
        self.policies.append(scheduling)
        self.knobs.append(knobs)


def test_a_live_edit_applies_and_a_bad_one_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(AFFINITY)
    applied, telemetry, published = Applied(), Telemetry(), list[PolicyState]()
    policy = PolicyFile(path, Overrides(), applied, telemetry)
    policy.on_state = published.append
    assert _running(_metrics(telemetry)) == [_hash(AFFINITY)] == [document_hash(AFFINITY.encode())]
    assert not policy.reread() and applied.policies == []  # unchanged bytes: nothing to do

    path.write_text(ROUND_ROBIN)
    assert policy.reread()
    assert [s.strict.name for s in applied.policies] == ["custom"] and not applied.policies[0].holds
    assert published == [PolicyState(_hash(ROUND_ROBIN))]

    path.write_text(TYPO)
    assert not policy.reread() and len(applied.policies) == 1  # refused: round-robin stays in force
    metrics = _metrics(telemetry)
    assert _running(metrics) == [_hash(ROUND_ROBIN)]
    assert 'lorapool_router_policy_reloads_total{result="refused"} 1.0' in metrics
    refused = published[-1]
    assert (refused.running, refused.refused) == (_hash(ROUND_ROBIN), document_hash(TYPO.encode()))
    assert refused.reason.startswith(f"--policy-file {path} is not a router policy (api.routerpolicy): ")
    assert "profiles.strict.filters.1: Input should be 'healthy', 'serves-model'," in refused.reason

    path.unlink()
    assert not policy.reread()  # a file that went away keeps what runs
    path.write_text(PREFIX)
    assert policy.reread() and published[-1] == PolicyState(_hash(PREFIX))  # the refusal is over
    assert policy.running.chain.prefix_weight == 1.5
    assert 'lorapool_router_policy_reloads_total{result="applied"} 2.0' in _metrics(telemetry)


def test_a_bad_file_at_start_stops_the_router_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    with pytest.raises(ValueError, match=f"^--policy-file {path}: cannot read it: "):
        read(path, Overrides())
    path.write_text(TYPO)
    with pytest.raises(ValueError, match=r"profiles\.strict\.filters\.1: Input should be"):
        read(path, Overrides())
    path.write_text("{" + HEAD + ', "policy": "round-robin", "weights": {"prefix": 1}}')
    with pytest.raises(ValueError, match=r"weights\.prefix: policy round-robin lists no scorer prefix"):
        read(path, Overrides())


def _settings(*argv: str) -> Overrides:
    parser = argparse.ArgumentParser()
    configure(parser)
    return settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1", *argv])).policy_overrides()


PRECEDENCE = {
    "no file: every policy flag, defaults left out": ((), Overrides(policy="affinity")),
    "no file, the bench's flags": (
        ("--policy", "least-loaded", "--hold-rule", "hold-if-active", "--load-factor", "1.5"),
        Overrides(policy="least-loaded", load_factor=1.5, hold_rule="hold-if-active"),
    ),
    "a file alone: the document decides": (("--policy-file", "f"), Overrides()),
    "a file and --prefix-weight alone: the flag's 1.5 over the document's": (
        ("--policy-file", "f", "--prefix-weight"),
        Overrides(prefix_weight=1.5),
    ),
    "a file and flags given: those flags over it": (
        ("--policy-file", "f", "--policy", "round-robin", "--load-slack", "3", "--max-wait", "5"),
        Overrides(policy="round-robin", load_slack=3.0, max_wait=5.0),
    ),
    "no file, the dispatch and slot flags": (
        ("--fair-dispatch", "--max-inflight", "8", "--max-wait", "5", "--max-loras", "4", "--max-cpu-loras", "32"),
        Overrides(policy="affinity", fair_dispatch=True, max_inflight=8, max_wait=5.0, max_loras=4, max_cpu_loras=32),
    ),
    "no file, dispatch flags at their defaults: left out": (
        ("--max-wait", "2", "--max-inflight", "0", "--max-queue-wait", "30", "--max-loras", "1"),
        Overrides(policy="affinity"),
    ),
    "a file and dispatch and slot flags given, even at their defaults": (
        ("--policy-file", "f", "--max-queue-wait", "30", "--max-prefilling", "3", "--max-loras", "1"),
        Overrides(max_prefilling=3, max_queue_wait=30.0, max_loras=1),
    ),
}


@pytest.mark.parametrize(("argv", "want"), list(PRECEDENCE.values()), ids=list(PRECEDENCE))
def test_policy_flags_given_override_the_file(argv: tuple[str, ...], want: Overrides) -> None:
    assert _settings(*argv) == want


DISPATCH = canonical(
    "{" + HEAD + ', "policy": "affinity", "dispatch": {"fair": true, "maxInflight": 16, "maxWaitSeconds": 5},'
    ' "slots": {"maxLoras": 8, "maxCpuLoras": 307}}'
)


def _knobs(path: Path, *argv: str) -> SchedulerKnobs:
    return read(path, _settings("--policy-file", str(path), *argv))[1].knobs


def test_dispatch_and_slot_flags_given_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(DISPATCH)
    assert _knobs(path) == SchedulerKnobs(
        fair=True, max_prefilling=0, max_inflight=16, max_queue_wait_s=30.0, max_wait_s=5.0, max_loras=8,
        max_cpu_loras=307,
    )  # fmt: skip
    over = _knobs(path, "--max-inflight", "4", "--max-loras", "2", "--max-wait", "0.5", "--max-prefilling", "2")
    assert (over.fair, over.max_inflight, over.max_prefilling, over.max_wait_s) == (True, 4, 2, 0.5)
    assert (over.max_loras, over.max_cpu_loras) == (2, 307)  # the flag's slots, the document's CPU cache
    with pytest.raises(ValueError, match=r": --max-loras over the policy document: slots: Value error, "
                       r"maxCpuLoras=307 is below maxLoras=400"):  # fmt: skip
        _knobs(path, "--max-loras", "400")


def test_a_live_edit_applies_new_dispatch_and_slots(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(AFFINITY)
    applied = Applied()
    policy = PolicyFile(path, Overrides(max_wait=9.0), applied, Telemetry())
    assert policy.running.knobs.max_wait_s == 9.0 and not policy.running.knobs.fair  # the flag over the file
    path.write_text(DISPATCH)
    assert policy.reread()
    [got] = applied.knobs
    assert (got.fair, got.max_inflight, got.max_wait_s, got.max_loras) == (True, 16, 9.0, 8)


FLAG_SETS = {
    "defaults": (),
    "dispatch": ("--fair-dispatch", "--max-prefilling", "4", "--max-inflight", "8", "--max-queue-wait", "7.5"),
    "waits and slots": ("--max-wait", "30", "--max-loras", "4", "--max-cpu-loras", "32"),
}


@pytest.mark.parametrize("argv", list(FLAG_SETS.values()), ids=list(FLAG_SETS))
def test_without_a_file_the_flags_document_sets_what_the_flags_always_set(argv: tuple[str, ...]) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1", *argv]))
    assert from_flags(settings.policy_overrides()).knobs == settings.knobs()


def test_every_existing_flag_keeps_its_default_without_a_file() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = settings_from(parser.parse_args(["--backend", "http://127.0.0.1:1"]))
    assert (settings.policy, settings.load_factor, settings.load_slack) == ("affinity", 1.25, 2.0)
    assert (settings.prefix_weight, settings.hold_rule, settings.policy_file) == (0.0, "", None)
    assert from_flags(settings.policy_overrides()).hash == _hash(AFFINITY)  # what the operator renders
    help_text = " ".join(parser.format_help().split())
    assert "with --policy-file: replaces the document's" in help_text
    for knob in (
        "dispatch.fair",
        "dispatch.maxInflight",
        "dispatch.maxWaitSeconds",
        "slots.maxLoras",
        "slots.maxCpuLoras",
    ):
        assert f"replaces the document's {knob})" in help_text
    assert (settings.max_wait_s, settings.max_queue_wait_s, settings.max_loras, settings.max_cpu_loras) == (
        2.0,
        30.0,
        1,
        None,
    )
    assert (settings.fair_dispatch, settings.max_inflight, settings.max_prefilling) == (False, 0, 0)


def test_the_policy_state_patch_sets_only_its_annotation() -> None:
    patch = json.loads(policy_patch(PolicyState("a1", refused="b2", reason="why")))
    assert patch == {"metadata": {"annotations": {"lorapool.io/router-policy": '{"h":"a1","r":{"h":"b2","m":"why"},"s":"file","v":1}'}}}  # fmt: skip


def _get(url: str, path: str) -> str:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_a_router_re_reads_its_policy_file_live(tmp_path: Path, start_sim: StartSim, start_router: StartRouter) -> None:
    path = tmp_path / "policy.json"
    path.write_text(AFFINITY)
    router = start_router([start_sim()], extra=["--policy-file", str(path)])
    wait_until("the first document's hash", lambda: _running(_get(router, "/metrics")) == [_hash(AFFINITY)])
    path.write_text(PREFIX)
    wait_until("the edit's hash", lambda: _running(_get(router, "/metrics")) == [_hash(PREFIX)])
    path.write_text(TYPO)
    refused = 'lorapool_router_policy_reloads_total{result="refused"} 1.0'

    def refusal() -> str | None:
        metrics = _get(router, "/metrics")
        return metrics if refused in metrics else None

    metrics = wait_until("the refusal", refusal)
    assert _running(metrics) == [_hash(PREFIX)]  # the last good one stays in force
    assert '"object"' in _get(router, "/v1/models")  # and the router serves on
