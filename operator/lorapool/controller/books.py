"""The pool's ``SharedBooks`` condition: whether its routers decide from one set of books (issue 43,
docs/high-availability.md). Pure.

Each router run with ``--shared-state`` writes ``lorapool.io/shared-books`` on its Pod
(``lorapool.api.books``): whether the store answers, how many other routers it reads. The operator
reads them with the router pods (``api.pods.RouterPod.books``) and says here, for a human, whether
the routers share their books, which ones lost the store and why, or that nothing is shared while
several routers run. A status only: routing goes on without the store (each router then decides from
its own books and the engines' metrics), so this never holds Ready back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lorapool.api.books import BooksState
from lorapool.api.models import LoRAPool
from lorapool.api.pods import RouterPod
from lorapool.api.status import Condition, ConditionStatus, ConditionType

SHARED_BOOKS = ConditionType.SHARED_BOOKS.value
MAX_NAMED = 5  # router pods a message names; the rest are counted

NOT_SHARED = (
    "{n} routers each keep their own books: each sees the requests the others bound and hold only through "
    "the engines' metrics a poll later, so they bind different adapters onto the same free slot (measured: "
    "0.64-0.92x the goodput of one router, up to 4.9x its p99 TTFT), and each enforces 1/{n} of a rate "
    "limit for the clients it serves; set spec.router.sharedState (rendered: {{}} runs a store for the pool, "
    "or url: an external Redis) so they share one set (docs/high-availability.md)"
)


@dataclass(frozen=True)
class SharedBooksObserved:
    """What the condition is computed from: the spec's side and the live router pods' states."""

    shared: bool  # spec.router.sharedState is set
    replicas: int  # spec.router.replicas
    routers: tuple[tuple[str, BooksState | None], ...] = ()  # live router pod -> its state (None: not yet)


def shared_books_observed(pool: LoRAPool, routers: Sequence[RouterPod]) -> SharedBooksObserved:
    """The condition's inputs: router pods being deleted are left out (their books expire in the store)."""
    live = tuple((r.name, r.books) for r in routers if not r.terminating)
    return SharedBooksObserved(pool.spec.router.shared_state is not None, pool.spec.router.replicas, live)


def _named(pods: Sequence[str]) -> str:
    more = f" and {len(pods) - MAX_NAMED} more" if len(pods) > MAX_NAMED else ""
    return ", ".join(pods[:MAX_NAMED]) + more


def _condition(status: ConditionStatus, reason: str, message: str, generation: int | None) -> Condition:
    """A SharedBooks condition, as ``api.status.condition`` makes the others (it takes the enum)."""
    return Condition(
        type=SHARED_BOOKS, status=status.value, reason=reason, message=message, observed_generation=generation
    )


def shared_books_condition(o: SharedBooksObserved, generation: int | None) -> Condition | None:
    """SharedBooks: None (absent) for one router without a store; False ``NotShared`` for several
    without one; with a store, False ``StoreUnreachable`` naming the routers that lost it and why,
    True ``Shared`` when every live router reads every other's books, else Unknown ``Waiting``."""
    if not o.shared:
        if o.replicas <= 1:
            return None
        return _condition(ConditionStatus.FALSE, "NotShared", NOT_SHARED.format(n=o.replicas), generation)
    down = [(pod, st) for pod, st in o.routers if st is not None and not st.up]
    if down:
        errors = "; ".join(f"{pod}: {st.error or 'no answer within its deadline'}" for pod, st in down[:MAX_NAMED])
        message = (
            f"{len(down)}/{len(o.routers)} router pod(s) cannot reach the shared store ({_named([p for p, _ in down])})"
            f": {errors}. They route from their own books and the engines' metrics meanwhile; check the store "
            "(spec.router.sharedState), its Secret and the NetworkPolicy"
        )
        return _condition(ConditionStatus.FALSE, "StoreUnreachable", message, generation)
    if not o.routers:
        return _condition(ConditionStatus.UNKNOWN, "Waiting", "no router pod runs yet", generation)
    silent = [pod for pod, st in o.routers if st is None]
    if silent:
        return _condition(
            ConditionStatus.UNKNOWN,
            "Waiting",
            f"router pod(s) {_named(silent)} have not reported the shared store yet",
            generation,
        )
    peers = len(o.routers) - 1
    behind = [f"{pod} ({st.peers})" for pod, st in o.routers if st is not None and st.peers != peers]
    if behind:
        message = f"every router reaches the store; not all see {peers} peer(s) yet: {_named(behind)}"
        return _condition(ConditionStatus.UNKNOWN, "Waiting", message, generation)
    message = f"{len(o.routers)} router pod(s) share one set of books through the store"
    return _condition(ConditionStatus.TRUE, "Shared", message, generation)
