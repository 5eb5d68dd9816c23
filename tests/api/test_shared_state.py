"""spec.router.sharedState (docs/high-availability.md): what it accepts, and each refusal naming the
field and the fix, offline (the models, as `lorapool plan` reads a pool) and in the CRD's CEL rules."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from lorapool.api.crd import crds
from lorapool.api.load import describe
from lorapool.api.models import LoRAPool
from lorapool.api.routing import SharedStateSpec, quantity_bytes


def problems(example_doc: dict[str, Any], shared: dict[str, Any]) -> list[str]:
    doc = copy.deepcopy(example_doc)
    doc["spec"]["router"] = {"sharedState": shared}
    try:
        LoRAPool.model_validate(doc)
    except ValidationError as exc:
        return describe(exc)
    return []


@pytest.mark.parametrize(
    "shared",
    [
        {"url": "redis://books.cache.svc:6379/0"},
        {"url": "rediss://cache.example"},
        {"url": "redis://10.0.0.7:65535/15"},
        {"url": "redis://[fd00::7]:6379"},
        {"url": "rediss://cache.example:6380/2", "credentialsSecret": {"name": "books-acl"}},
        {"rendered": {}},
        {"rendered": {"maxMemory": "8Mi", "image": "valkey/valkey:8"}},
        {"rendered": {"maxMemory": "1Gi"}},
    ],
    ids=["svc", "tls-no-port", "ip-top-port-db15", "ipv6", "with-secret", "rendered", "rendered-min", "rendered-1Gi"],
)
def test_accepted(example_doc: dict[str, Any], shared: dict[str, Any]) -> None:
    assert problems(example_doc, shared) == []


@pytest.mark.parametrize(
    ("shared", "path", "words"),
    [
        ({"url": "redis://user:pw@cache:6379"}, "url", "put them in a Secret named by credentialsSecret"),
        ({"url": "redis://:pw@cache:6379"}, "url", "must not carry credentials"),
        ({"url": "http://cache:6379"}, "url", "must start with redis:// or rediss://"),
        ({"url": "cache:6379"}, "url", "e.g. redis://books.cache.svc:6379/0"),
        ({"url": "redis://cache:0"}, "url", "PORT 1-65535"),
        ({"url": "redis://cache:65536"}, "url", "PORT 1-65535"),
        ({"url": "redis://cache:6379/16"}, "url", "DB 0-15"),
        ({"url": "redis://cache:6379/0?ssl=true"}, "url", "nothing after"),
        ({"url": "redis://"}, "url", "redis[s]://HOST[:PORT][/DB]"),
        ({"url": "redis://cache", "rendered": {}}, "", "sets both url and rendered"),
        ({}, "", "must be url (a store you run) or rendered (one the operator runs)"),
        ({"rendered": {}, "credentialsSecret": {"name": "x"}}, "", "credentialsSecret must be set with url only"),
        ({"rendered": {"maxMemory": "4Mi"}}, "rendered.maxMemory", "from 8Mi to 64Gi"),
        ({"rendered": {"maxMemory": "65Gi"}}, "rendered.maxMemory", "from 8Mi to 64Gi"),
        ({"rendered": {"maxMemory": "lots"}}, "rendered.maxMemory", "e.g. 64Mi"),
        ({"url": "redis://c", "credentialsSecret": {"name": "Bad_Name"}}, "credentialsSecret.name", "object name"),
        (
            {"url": "redis://c", "credentialsSecret": {"name": "s", "passwordKey": ""}},
            "credentialsSecret.passwordKey",
            "at least 1",
        ),
    ],
)
def test_refused_naming_the_field_and_the_fix(
    example_doc: dict[str, Any], shared: dict[str, Any], path: str, words: str
) -> None:
    found = problems(example_doc, shared)
    field = "spec.router.sharedState" + (f".{path}" if path else "")
    assert any(p.startswith(field) and words in p for p in found), found
    assert not any(":pw@" in p for p in found)  # a refusal (which status shows) never repeats a password


def test_the_crd_carries_the_same_rules_with_the_same_words() -> None:
    """The API server refuses what the models refuse, with the same messages (tests/api/test_crd.py
    checks every rule's message says what a valid value looks like)."""
    pool = next(c for c in crds().values() if c["spec"]["names"]["kind"] == "LoRAPool")
    router = pool["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["router"]
    shared = router["properties"]["sharedState"]
    messages = " | ".join(r["message"] for r in shared["x-kubernetes-validations"])
    assert "sets both url and rendered" in messages and "must be url" in messages
    assert "credentialsSecret must be set with url only" in messages
    url_messages = " | ".join(r["message"] for r in shared["properties"]["url"]["x-kubernetes-validations"])
    assert "PORT 1-65535 and DB 0-15" in url_messages and "credentials" not in url_messages
    # On the object, named by fieldPath: the API server prints a failing string field's value, not an object's.
    (credentials,) = [r for r in shared["x-kubernetes-validations"] if "must not carry credentials" in r["message"]]
    assert credentials["fieldPath"] == ".url"
    memory = shared["properties"]["rendered"]["properties"]["maxMemory"]
    assert memory["default"] == "64Mi" and "quantity(self)" in memory["x-kubernetes-validations"][0]["rule"]
    assert "sharedState" not in router.get("required", [])  # optional: without it nothing changes


def test_defaults_and_quantities() -> None:
    rendered = SharedStateSpec.model_validate({"rendered": {}}).rendered
    assert rendered is not None and rendered.max_memory == "64Mi" and rendered.max_memory_bytes == 64 * 2**20
    secret = SharedStateSpec.model_validate({"url": "redis://c", "credentialsSecret": {"name": "s"}}).credentials_secret
    assert secret is not None and (secret.username_key, secret.password_key) == ("username", "password")
    assert [quantity_bytes(q) for q in ("8Mi", "1.5Gi", "100M", "512", "8 Mi", "-1Mi")] == [
        8 * 2**20,
        int(1.5 * 2**30),
        100 * 10**6,
        512,
        None,
        None,
    ]
