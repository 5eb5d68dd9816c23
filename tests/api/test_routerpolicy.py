"""The router policy document: what it accepts, what it refuses (naming the field and the fix), its wire forms."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from lorapool.api.common import RouterPolicy
from lorapool.api.pods import router_pod
from lorapool.api.routerpolicy import (
    ANNOTATION,
    MAX_REASON,
    PolicyState,
    RouterPolicyDocument,
    ScorerName,
    decode_state,
    document_hash,
    encode_state,
    named_document,
    problems,
)

HEAD = {"apiVersion": "lorapool.io/v1alpha1", "kind": "RouterPolicy"}
STRICT = {"filters": ["healthy", "serves-model"], "scorers": [{"plugin": "least-load", "weight": 1}]}


def parse(**fields: Any) -> RouterPolicyDocument:
    return RouterPolicyDocument.model_validate({**HEAD, **fields})


GOOD = {
    "a named policy": {"policy": "affinity"},
    "a named policy with prefix locality and its own cap": {
        "policy": "affinity",
        "weights": {"prefix": 1.5},
        "hold": "hold-if-active",
        "parameters": {"bounded-load": {"loadFactor": 1.5, "loadSlack": 1}},
    },
    "a chain that never holds": {"profiles": {"strict": STRICT}},
    "a chain that holds": {
        "name": "mine",
        "profiles": {"strict": STRICT, "fallback": {"filters": ["healthy"], "picker": "round-robin"}},
        "hold": "hold-always",
        "weights": {"least-load": 2},
    },
    "dispatch and slots (what the operator renders from spec.router.dispatch and the plan)": {
        "policy": "affinity",
        "dispatch": {
            "fair": True,
            "maxPrefilling": 4,
            "maxInflight": 16,
            "maxQueueWaitSeconds": 7.5,
            "maxWaitSeconds": 0,
        },
        "slots": {"maxLoras": 8, "maxCpuLoras": 307},
    },
    "slots without a CPU cache size": {"policy": "round-robin", "slots": {"maxLoras": 2}},
}


@pytest.mark.parametrize("fields", list(GOOD.values()), ids=list(GOOD))
def test_good_documents_round_trip(fields: dict[str, Any]) -> None:
    doc = parse(**fields)
    again = RouterPolicyDocument.from_json(doc.to_json())
    assert again == doc and again.hash == doc.hash == document_hash(doc.to_json().encode())


BAD = {
    "no apiVersion": ({"kind": "RouterPolicy", "policy": "affinity"}, "apiVersion: Field required"),
    "another apiVersion": (
        {**HEAD, "apiVersion": "lorapool.io/v2", "policy": "affinity"},
        "apiVersion: Input should be 'lorapool.io/v1alpha1'",
    ),
    "neither policy nor profiles": (HEAD, "give either policy (a named policy: affinity, least-loaded, round-robin)"),
    "both policy and profiles": (
        {**HEAD, "policy": "affinity", "profiles": {"strict": STRICT}},
        "give either policy",
    ),
    "an unknown policy": (
        {**HEAD, "policy": "fastest"},
        "policy: Input should be 'affinity', 'round-robin' or 'least-loaded'",
    ),
    "an unknown filter names the known ones": (
        {**HEAD, "profiles": {"strict": {"filters": ["healthy", "gpu-free"]}}},
        "profiles.strict.filters.1: Input should be 'healthy', 'serves-model', 'bounded-load', 'lora-slots' or"
        " 'saturation'",
    ),
    "an unknown scorer names the known ones": (
        {**HEAD, "profiles": {"strict": {"scorers": [{"plugin": "latency", "weight": 1}]}}},
        "profiles.strict.scorers.0.plugin: Input should be 'lora-affinity', 'least-load', 'kv-cache',",
    ),
    "a filter listed twice": (
        {**HEAD, "profiles": {"strict": {"filters": ["healthy", "healthy"]}}},
        "profiles.strict: Value error, filters lists 'healthy' twice; list each plugin once",
    ),
    "a negative weight": (
        {**HEAD, "profiles": {"strict": {"scorers": [{"plugin": "kv-cache", "weight": -1}]}}},
        "scorer kv-cache: weight -1 must be a finite number in [0, 100] (0 leaves the scorer out)",
    ),
    "a weight override out of range": (
        {**HEAD, "policy": "affinity", "weights": {"prefix": 1000}},
        "weights: Value error, weights.prefix: weight 1000 must be a finite number in [0, 100]",
    ),
    "a weight for a scorer no profile lists": (
        {**HEAD, "profiles": {"strict": STRICT}, "weights": {"prefix": 1.5}},
        "weights.prefix: no profile lists scorer prefix; add it to a profile's scorers with its weight",
    ),
    "a hold rule for a chain that never holds": (
        {**HEAD, "profiles": {"strict": STRICT}, "hold": "hold-if-active"},
        "hold hold-if-active needs profiles.fallback",
    ),
    "an unknown hold rule": ({**HEAD, "policy": "affinity", "hold": "wait"}, "hold: Input should be 'hold-always' or"),
    "parameters for a plugin that takes none": (
        {**HEAD, "policy": "affinity", "parameters": {"prefix": {"weight": 1}}},
        "no plugin named 'prefix' takes parameters; plugins with parameters: bounded-load",
    ),
    "an unknown parameter": (
        {**HEAD, "policy": "affinity", "parameters": {"bounded-load": {"factor": 2}}},
        "parameters.bounded-load.factor: Extra inputs are not permitted",
    ),
    "a load factor of zero": (
        {**HEAD, "policy": "affinity", "parameters": {"bounded-load": {"loadFactor": 0}}},
        "parameters.bounded-load.loadFactor: Input should be greater than 0",
    ),
    "an unknown field": ({**HEAD, "policy": "affinity", "polcy": "x"}, "polcy: Extra inputs are not permitted"),
    "a per-replica cap above spec.router.dispatch's": (
        {**HEAD, "policy": "affinity", "dispatch": {"maxInflight": 5000}},
        "dispatch.maxInflight: Value error, 5000 requests per replica is outside [0, 4096]; give 1 to 4096, or 0",
    ),
    "a negative prefill cap": (
        {**HEAD, "policy": "affinity", "dispatch": {"maxPrefilling": -1}},
        "dispatch.maxPrefilling: Value error, -1 requests per replica is outside [0, 4096]",
    ),
    "a queue wait of zero": (
        {**HEAD, "policy": "affinity", "dispatch": {"maxQueueWaitSeconds": 0}},
        "dispatch.maxQueueWaitSeconds: Value error, 0 s is outside (0, 600]; give a finite number of seconds in it",
    ),
    "an endless slot wait": (
        {**HEAD, "policy": "affinity", "dispatch": {"maxWaitSeconds": 1e9}},
        "dispatch.maxWaitSeconds: Value error, 1e+09 s is outside [0, 600]",
    ),
    "fair dispatch that is not a boolean": (
        {**HEAD, "policy": "affinity", "dispatch": {"fair": "sometimes"}},
        "dispatch.fair: Input should be a valid boolean",
    ),
    "an unknown dispatch knob": (
        {**HEAD, "policy": "affinity", "dispatch": {"maxQueued": 10}},
        "dispatch.maxQueued: Extra inputs are not permitted",
    ),
    "no LoRA slots": (
        {**HEAD, "policy": "affinity", "slots": {"maxLoras": 0}},
        "slots.maxLoras: Value error, 0 slots: give at least 1",
    ),
    "a CPU cache smaller than the GPU slots": (
        {**HEAD, "policy": "affinity", "slots": {"maxLoras": 8, "maxCpuLoras": 4}},
        "slots: Value error, maxCpuLoras=4 is below maxLoras=8 (vLLM requires max-cpu-loras >= max-loras); give at"
        " least 8, or leave it out",
    ),
}


@pytest.mark.parametrize(("data", "message"), list(BAD.values()), ids=list(BAD))
def test_bad_documents_are_refused_naming_the_field_and_the_fix(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RouterPolicyDocument.model_validate_json(json.dumps(data))
    assert message in problems(caught.value)


def test_dispatch_and_slots_at_their_defaults_leave_the_document_as_it_was() -> None:
    """A document without dispatch or slots runs the router flags' defaults, and writing those defaults
    out changes neither its text nor its hash (what routers publish)."""
    plain = parse(policy="affinity")
    spelled = parse(
        policy="affinity",
        dispatch={"fair": False, "maxPrefilling": 0, "maxInflight": 0, "maxQueueWaitSeconds": 30, "maxWaitSeconds": 2},
        slots={"maxLoras": 1},
    )
    assert spelled.to_json() == plain.to_json() and spelled.hash == plain.hash
    assert (plain.dispatch.max_wait_seconds, plain.dispatch.max_queue_wait_seconds, plain.slots.max_loras) == (2, 30, 1)


def test_a_named_document_is_what_the_operator_renders() -> None:
    doc = named_document(RouterPolicy.AFFINITY, weights={ScorerName.PREFIX: 1.5})
    assert json.loads(doc.to_json()) == {**HEAD, "policy": "affinity", "weights": {"prefix": 1.5}}
    assert doc.label == "affinity" and parse(profiles={"strict": STRICT}).label == "custom"


STATES = {
    "running": PolicyState("a1b2c3d4e5f60718"),
    "flags": PolicyState("a1b2c3d4e5f60718", source="flags"),
    "refused": PolicyState("a1b2c3d4e5f60718", refused="ffeeddccbbaa9988", reason="--policy-file f: kind: ..."),
}


@pytest.mark.parametrize("state", list(STATES.values()), ids=list(STATES))
def test_the_policy_state_annotation_round_trips(state: PolicyState) -> None:
    text = encode_state(state)
    assert decode_state(text) == state
    pod = {"metadata": {"name": "p-router-x", "annotations": {ANNOTATION: text}}}
    assert router_pod(pod).policy == state


@pytest.mark.parametrize("text", [None, "", "{", '{"v": 2, "h": "x"}', "[]", '{"v": 1}'])
def test_an_unreadable_state_is_none(text: str | None) -> None:
    assert decode_state(text) is None


def test_a_long_reason_is_cut() -> None:
    state = decode_state(encode_state(PolicyState("a", refused="b", reason="x" * 5000)))
    assert state is not None and len(state.reason) == MAX_REASON
