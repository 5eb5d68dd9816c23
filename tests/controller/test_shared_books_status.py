"""The pool's SharedBooks condition (controller.books, docs/high-availability.md) from the router pods'
``lorapool.io/shared-books`` annotations, each case of the table; that it never holds Ready back; and
the objects the operator prunes when the spec stops rendering the store or the routers' budget. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lorapool.api.books import ANNOTATION, BooksState, encode_state
from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.api.pods import router_pods
from lorapool.api.status import Condition, ConditionType
from lorapool.controller.books import SharedBooksObserved, shared_books_condition, shared_books_observed
from lorapool.controller.gateway import door_leftovers
from lorapool.controller.status import pool_status
from lorapool.plan.planner import plan_pool
from lorapool.render.manifests import render_pool
from tests.controller.test_status import BASE  # the one ready pool the status tests share

UP1, UP2 = BooksState(up=True, peers=1), BooksState(up=True, peers=2)
DOWN = BooksState(up=False, error="connect to books.ml.svc:6379: connection refused")


def seen(
    *routers: tuple[str, BooksState | None], shared: bool = True, replicas: int | None = None
) -> SharedBooksObserved:
    return SharedBooksObserved(shared, len(routers) if replicas is None else replicas, tuple(routers))


def verdict(o: SharedBooksObserved) -> Condition | None:
    return shared_books_condition(o, 7)


@pytest.mark.parametrize(
    ("observed", "status", "reason", "words"),
    [
        (seen(shared=False, replicas=1), None, None, ()),
        (seen(shared=False, replicas=0), None, None, ()),
        (
            seen(shared=False, replicas=3),
            "False",
            "NotShared",
            ("3 routers each keep their own books", "0.64-0.92x", "4.9x", "1/3 of a rate", "spec.router.sharedState"),
        ),
        (seen(("r-a", UP1), ("r-b", UP1)), "True", "Shared", ("2 router pod(s) share one set of books",)),
        (seen(("r-a", BooksState(up=True))), "True", "Shared", ()),  # one router with a store: 0 peers
        (
            seen(("r-a", UP2), ("r-b", DOWN), ("r-c", UP2)),
            "False",
            "StoreUnreachable",
            ("1/3 router pod(s)", "r-b: connect to books.ml.svc:6379: connection refused", "their own books"),
        ),
        (seen(("r-a", DOWN), ("r-b", None)), "False", "StoreUnreachable", ("r-a",)),  # down outranks silent
        (seen(("r-a", BooksState(up=False))), "False", "StoreUnreachable", ("no answer within its deadline",)),
        (seen(("r-a", UP1), ("r-b", None)), "Unknown", "Waiting", ("r-b have not reported",)),
        (seen(replicas=2), "Unknown", "Waiting", ("no router pod runs yet",)),
        (seen(("r-a", UP1), ("r-b", BooksState(up=True))), "Unknown", "Waiting", ("r-b (0)", "1 peer(s)")),
        (seen(("r-a", UP2), ("r-b", UP2)), "Unknown", "Waiting", ("r-a (2)",)),  # a dead router not expired yet
    ],
    ids=[
        "one-router-no-store-absent",
        "no-router-no-store-absent",
        "several-no-store",
        "shared",
        "one-router-with-store",
        "one-down",
        "down-and-silent",
        "down-without-error",
        "one-silent",
        "none-yet",
        "peer-not-seen-yet",
        "peer-gone-not-expired",
    ],
)
def test_condition(observed: SharedBooksObserved, status: str | None, reason: str | None, words: tuple[str]) -> None:
    got = verdict(observed)
    if status is None:
        assert got is None
        return
    assert got is not None and got.type == ConditionType.SHARED_BOOKS == "SharedBooks"
    assert (got.status, got.reason, got.observed_generation) == (status, reason, 7)
    for word in words:
        assert word in got.message, got.message


def test_many_routers_down_are_named_up_to_five_and_counted() -> None:
    routers = [(f"r-{i}", DOWN) for i in range(8)]
    got = verdict(seen(*routers))
    assert got is not None and "8/8" in got.message and "r-4 and 3 more" in got.message
    assert "r-5:" not in got.message  # errors of the named ones only: a bounded message


def pod(name: str, books: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": {ANNOTATION: books} if books is not None else {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-08T00:00:00Z"
    return {"metadata": meta}


def pool(**router: Any) -> LoRAPool:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml", "uid": "u-1"},
            "spec": {
                "baseModel": {"name": "meta-llama/Meta-Llama-3-8B", "source": "hf://meta-llama/Meta-Llama-3-8B"},
                "gpu": {"product": "A100-80GB"},
                "router": router,
            },
        }
    )
    assert isinstance(obj, LoRAPool)
    return obj


def test_router_pods_annotations_are_read_once_and_terminating_ones_left_out() -> None:
    """What the routers write (api.books.encode_state) is what the operator reads; an unreadable or
    newer annotation is "not reported", and a router being deleted counts no more."""
    items = [
        pod("r-a", encode_state(UP1)),
        pod("r-b", encode_state(UP1)),
        pod("r-old", encode_state(DOWN), deleting=True),
        pod("r-new", '{"v":2,"up":true}'),
    ]
    routers = router_pods(items)
    assert [r.books for r in routers[:2]] == [UP1, UP1] and routers[3].books is None
    observed = shared_books_observed(pool(replicas=3, sharedState={"rendered": {}}), routers)
    assert observed == SharedBooksObserved(True, 3, (("r-a", UP1), ("r-b", UP1), ("r-new", None)))
    got = verdict(observed)
    assert got is not None and (got.status, got.reason) == ("Unknown", "Waiting") and "r-new" in got.message


def test_the_condition_rides_in_the_pool_status_and_never_holds_ready_back() -> None:
    down = replace(BASE, shared_books=seen(("r-a", DOWN), ("r-b", DOWN)))
    status = pool_status(down)
    by_type = {c.type: c for c in status.conditions}
    assert by_type["SharedBooks"].status == "False" and by_type["SharedBooks"].reason == "StoreUnreachable"
    assert by_type["Ready"].status == "True" and by_type["Available"].status == "True"
    assert "connection refused" not in by_type["Degraded"].message  # a status of the routers, not a problem
    one = replace(BASE, shared_books=seen(shared=False, replicas=1))
    assert "SharedBooks" not in {c.type for c in pool_status(one).conditions}
    assert "SharedBooks" not in {c.type for c in pool_status(BASE).conditions}  # not observed: not written


def _leftovers(p: LoRAPool) -> set[tuple[str, str]]:
    return set(door_leftovers(p, served=True))


STORE = {("Deployment", "p-books"), ("Service", "p-books"), ("NetworkPolicy", "p-books")}


@pytest.mark.parametrize(
    ("router", "store_pruned", "budget_pruned"),
    [
        ({}, True, True),
        ({"replicas": 3}, True, False),
        ({"replicas": 3, "sharedState": {"rendered": {}}}, False, False),
        ({"replicas": 1, "sharedState": {"rendered": {}}}, False, True),
        ({"replicas": 3, "sharedState": {"url": "redis://cache:6379"}}, True, False),
    ],
    ids=["defaults", "several-no-store", "several-rendered", "one-rendered", "several-external"],
)
def test_prune_what_the_spec_no_longer_renders(router: dict[str, Any], store_pruned: bool, budget_pruned: bool) -> None:
    p = pool(**router)
    gone = _leftovers(p)
    assert gone & STORE == (STORE if store_pruned else set())
    assert (("PodDisruptionBudget", "p-router") in gone) == budget_pruned
    rendered = {(o["kind"], o["metadata"]["name"]) for o in render_pool(p, plan_pool(p.spec, []), [])}
    assert not gone & rendered  # never prune what this spec renders
