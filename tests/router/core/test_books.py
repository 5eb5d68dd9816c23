"""Shared books, the pure part (issue 43): entries on the wire, the peers' sums, their expiry, the
demand shares of a pool limit, and a backend's view with the other routers' books in it."""

from __future__ import annotations

import math

import pytest

from lorapool.api.books import BooksState, decode_state, encode_state
from lorapool.router.core.books import (
    MIN_SHARE,
    BackendBooks,
    DemandMeter,
    Entry,
    PeerBooks,
    PeerLoad,
    decode,
    demand_share,
    encode,
)
from lorapool.router.core.ratelimit import Allow
from lorapool.router.core.state import BackendState
from tests.router.core.test_ratelimit import limiter

B1, B2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def entry(router: str, seq: int = 1, **backends: BackendBooks) -> Entry:
    urls = {"b1": B1, "b2": B2}
    return Entry(router, seq, {urls[k]: v for k, v in backends.items()}, {"sql": 2}, {"sql": 3.5})


def test_an_entry_round_trips_and_junk_is_none_not_a_crash() -> None:
    e = entry("r1", 7, b1=BackendBooks(3, 1, {"sql": 2, "chat": 1}))
    assert decode(encode(e)) == e
    for junk in (
        b"",
        b"null",
        b"[]",
        b'{"v": 2}',
        b'{"v": 1, "r": "x"}',
        b'{"v":1,"r":"x","s":1,"b":{"u":[1]}}',
        "\xff",
    ):
        assert decode(junk) is None
    # an adapter with no request is not a claim
    assert decode(b'{"v":1,"r":"x","s":1,"b":{"u":[1,0,{"a":0,"b":1}]}}').backends["u"].active == {"b": 1}


def test_peers_sum_per_backend_ignore_me_and_older_entries() -> None:
    peers = PeerBooks("me", ttl_s=2.0)
    assert peers.update(entry("me", b1=BackendBooks(9, 9, {"x": 9})), 0.0) is False  # our own echo
    assert peers.update(entry("r1", b1=BackendBooks(2, 1, {"sql": 2})), 0.0)
    assert peers.update(entry("r2", b1=BackendBooks(1, 0, {"sql": 1}), b2=BackendBooks(1, 1, {"chat": 1})), 0.0)
    assert peers.on(B1) == PeerLoad(3, 1, {"sql": 3}) and peers.on(B2) == PeerLoad(1, 1, {"chat": 1})
    assert peers.on("http://elsewhere") == PeerLoad()
    assert peers.demand("sql") == 7.0 and peers.held("sql") == 4 and peers.demand("other") == 0
    # a late message (lower seq) does not undo a newer one
    assert peers.update(entry("r1", 5, b1=BackendBooks(0, 0, {})), 0.1)
    assert peers.update(entry("r1", 4, b1=BackendBooks(5, 5, {"sql": 5})), 0.2) is False
    assert peers.on(B1).active == {"sql": 1}


def test_peers_expire_after_their_ttl_and_a_resync_drops_routers_the_store_lost() -> None:
    peers = PeerBooks("me", ttl_s=2.0)
    peers.update(entry("r1", b1=BackendBooks(1, 0, {"sql": 1})), 0.0)
    peers.update(entry("r2", b1=BackendBooks(1, 0, {"chat": 1})), 1.5)
    assert peers.expire(1.9) is False and len(peers) == 2
    assert peers.expire(2.0) is True and peers.routers() == ["r2"] and peers.on(B1).active == {"chat": 1}
    # the store holds r3 only now: r2 is gone (its TTL passed on the store's clock)
    assert peers.replace_all([entry("r3", b2=BackendBooks(1, 1, {"code": 1}))], 2.1)
    assert peers.routers() == ["r3"] and peers.on(B1) == PeerLoad()
    assert peers.replace_all([entry("r3", b2=BackendBooks(1, 1, {"code": 1}))], 2.2) is False  # nothing new
    assert peers.clear() and len(peers) == 0


def test_a_backends_view_counts_the_peers_books_beside_its_own_and_the_metrics() -> None:
    state = BackendState(B1, max_loras=2)
    state.begin("sql", is_adapter=True)
    state.set_peers(PeerLoad(3, 2, {"sql": 1, "chat": 2}))
    view = state.view()
    assert dict(view.active) == {"sql": 2, "chat": 2} and view.load == 4 and view.prefilling == 3
    assert "chat" in view.warm  # what a peer runs here is warm here
    # the engine's metrics (which include the peers' requests) are a floor, never added on top
    state.foreign_load = 5
    assert state.view().load == 6
    state.set_peers(PeerLoad())
    assert dict(state.view().active) == {"sql": 1} and state.view().prefilling == 1


@pytest.mark.parametrize(
    ("mine", "peers", "share"),
    [
        (1.0, 0.0, 1.0),
        (1.0, 1.0, 0.5),
        (1.0, 3.0, 0.25),
        (0.0, 0.0, 1.0),
        (0.0, 5.0, MIN_SHARE),
        (1e-6, 10.0, MIN_SHARE),
    ],
)
def test_a_routers_share_of_a_limit_is_its_share_of_the_demand(mine: float, peers: float, share: float) -> None:
    assert math.isclose(demand_share(mine, peers), share)


def test_demand_decays_and_is_forgotten() -> None:
    meter = DemandMeter(tau_s=2.0)
    for i in range(20):
        meter.asked("sql", i * 0.1)  # 10/s for 2 s
    assert 3.0 < meter.rate("sql", 2.0) < 10.0
    assert meter.rate("sql", 30.0) < 1e-3 and meter.rates(30.0) == {}
    meter.asked("gone", 0.0)
    meter.forget_except({"sql": None})
    assert meter.rates(0.0) == {}


def test_a_grown_share_refills_faster_but_hands_out_no_burst_at_once() -> None:
    rl = limiter(3, requests_per_second=3, burst_requests=3)
    assert isinstance(rl.check("sql", 0, 0.0), Allow)  # 1/3 of the burst: one request
    assert not isinstance(rl.check("sql", 0, 0.0, share=1.0), Allow)  # no burst appears from nothing
    assert isinstance(rl.check("sql", 0, 0.34, share=1.0), Allow)  # it refills at 3/s now, not 1/s
    assert not isinstance(rl.check("sql", 0, 0.5, share=1.0), Allow)


def test_the_books_state_annotation_round_trips_and_bounds_its_error() -> None:
    state = BooksState(False, 2, "write: ConnectionError: " + "x" * 500, 1765000000.5)
    back = decode_state(encode_state(state))
    assert back is not None and back.up is False and back.peers == 2 and len(back.error) == 300
    for junk in (None, "", "{", '{"v": 2, "up": true}', '{"v": 1, "up": "yes"}', '{"v": 1, "up": true, "peers": "2"}'):
        assert decode_state(junk) is None


def test_fair_dispatch_counts_the_service_peers_gave_once_and_a_restarted_peer_from_nothing() -> None:
    from lorapool.api.traffic import Priority
    from lorapool.router.core.fairness import VirtualTokenCounter

    peer, mine = VirtualTokenCounter(), VirtualTokenCounter()
    peer.charge("flood", 1000, Priority.STANDARD)  # 500 weighted
    peer.charge("quiet", 100, Priority.STANDARD)
    peer.correct("flood", 1000, 600, Priority.STANDARD)  # used less: 300 weighted in all
    books = PeerBooks("me", ttl_s=2.0)
    sent = Entry("r1", 1, {}, service=peer.served_recently(10), boot="a")
    assert decode(encode(sent)) == sent
    books.update(sent, 0.0)
    mine.backlogged("flood", []), mine.backlogged("quiet", ["flood"])  # both waiting here, at 0
    mine.add_peers(books.take_service())
    assert mine.counter("flood") == 300 and mine.counter("quiet") == 50
    assert books.take_service() == {} and not books.has_service()
    books.update(sent, 0.1)  # heard again (a resync): nothing counts twice
    assert books.take_service() == {}
    peer.charge("flood", 200, Priority.STANDARD)
    books.update(Entry("r1", 2, {}, service=peer.served_recently(10), boot="a"), 0.2)
    assert books.take_service() == {"flood": 100}
    books.expire(10.0)  # cut off, then heard again with the same totals: still nothing twice
    books.update(Entry("r1", 3, {}, service=peer.served_recently(10), boot="a"), 10.1)
    assert books.take_service() == {}
    # restarted (a new boot, seq from 1 again): its totals start from nothing and are all new
    books.update(Entry("r1", 1, {}, service={"flood": 40.0}, boot="b"), 10.2)
    assert books.take_service() == {"flood": 40.0}
    assert peer.served_recently(1) == {"flood": 400.0}  # the key charged last


def test_a_peers_older_or_higher_class_head_goes_first_where_it_fits() -> None:
    from lorapool.router.core.books import peer_goes_first, pool_order

    order = pool_order(None)
    mine = order("sql", 100.0, 1)  # a standard request waiting since t=100
    fits = lambda m: m != "elsewhere"  # noqa: E731
    assert peer_goes_first(mine, [("chat", 99.0, 1)], order, fits)  # older, same class
    assert not peer_goes_first(mine, [("chat", 101.0, 1)], order, fits)  # younger
    assert peer_goes_first(mine, [("chat", 105.0, 0)], order, fits)  # younger but critical
    assert not peer_goes_first(mine, [("elsewhere", 1.0, 0)], order, fits)  # cannot use this slot
    assert not peer_goes_first(mine, [], order, fits)
    counters = {"flood": 500.0, "quiet": 10.0}
    fair = pool_order(counters.__getitem__)  # fair dispatch: the least served first, whatever the age
    assert peer_goes_first(fair("flood", 1.0, 1), [("quiet", 50.0, 1)], fair, fits)
    assert not peer_goes_first(fair("quiet", 50.0, 1), [("flood", 1.0, 1)], fair, fits)
    entry = Entry("r1", 1, {}, heads={"sql": (1765000000.125, 0)})
    assert decode(encode(entry)) == entry
