"""Keep this router's books in a Redis-protocol store beside the other routers' (``--shared-state``). Shell.

The pure part is ``core.books``: what an entry holds and how the peers' entries fold into each
backend's view. This module moves entries (issue 43):

- **Write**: whenever the scheduler's books change (a bind, a first token, a release) the writer
  wakes and stores this router's entry with one atomic script: the entry in the pool's hash, its
  expiry (now + TTL, on the store's clock) in the pool's sorted set, and the entry published on the
  pool's channel. Changes within ``LINGER_S`` of the first go in the same write, so a busy router
  writes at most ~200 times a second, not once per change. A heartbeat writes every
  ``interval`` even when nothing changed, keeping the entry alive.
- **Hear**: a subscription to the channel folds each peer's entry in as it is published (a claim
  on a slot reaches the other routers in one round trip, not a metrics poll later).
- **Resync**: every ``interval`` one script drops the entries whose expiry passed on the store's
  clock (a router that died: its claims expire) and returns the live ones, which replace the peers.

A routing decision never waits on the store: it reads the peers as last heard. Every store call has
a short deadline; past it, or on any error, the store is "down": the peers' entries are dropped
after their TTL on this router's clock, so it decides from its own books and the engines' metrics
as a lone router does, counts each such decision, and says so on its Pod (``api.books``) for the
pool's ``SharedBooks`` condition. Keys are ``lorapool:{KEY}:...`` (``--shared-state-key``, the
pool's UID as the operator renders it): one store serves many pools, and the braces keep a pool's
keys in one Redis Cluster slot. Credentials come from the URL or the environment, never a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from lorapool.api.books import BooksState
from lorapool.render.books import PASSWORD_ENV, USERNAME_ENV
from lorapool.router.core.books import PeerBooks, decode, encode
from lorapool.router.scheduler import Scheduler
from lorapool.router.settings import RouterSettings
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router.sharedbooks")

# An entry lives this many intervals without a write: a router missing two heartbeats is still alive.
TTL_INTERVALS = 4
# The writer lingers this long after a change before it writes, so the changes of a few ms go in one
# write, and a short request's bind and release in the same one, after it answered: written at once,
# at 500 requests a second (a thousand changes) the writes kept the router's one loop ~30 % busy and
# added ~1.5 ms to its p50. A bind that takes a free slot does not wait for it: ``claim`` writes at once.
LINGER_S = 0.005
# A claim waits at most this long (or the store's deadline, if shorter): past it the bind stands.
CLAIM_DEADLINE_S = 0.02

# Every script's keys: KEYS[1] the pool's entries (hash, by router), KEYS[2] their expiries (sorted set).
# The prelude reads the store's clock (an expiry is on it, never a router's) and defines what the
# scripts share: ``prune`` drops the entries whose expiry passed (HDEL and ZREM together), ``store``
# keeps a router's entry for ``ttl`` ms and publishes it on the pool's channel.
PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function prune()
  local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  if #dead > 0 then
    redis.call('HDEL', KEYS[1], unpack(dead))
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  end
end
local function store(router, entry, ttl, channel)
  redis.call('HSET', KEYS[1], router, entry)
  redis.call('ZADD', KEYS[2], now + ttl, router)
  redis.call('PEXPIRE', KEYS[1], ttl * 4)
  redis.call('PEXPIRE', KEYS[2], ttl * 4)
  redis.call('PUBLISH', channel, entry)
end
"""

# ARGV: the entry, the TTL in ms, the channel, the router.
WRITE = (
    PRELUDE
    + """
store(ARGV[4], ARGV[1], tonumber(ARGV[2]), ARGV[3])
return now
"""
)

# The live entries, after dropping those whose expiry passed.
READ = (
    PRELUDE
    + """
prune()
return redis.call('HVALS', KEYS[1])
"""
)

# ARGV: the router, the backend, the adapter, the backend's LoRA slots, this router's other adapters
# there (JSON list), the TTL in ms, the channel, the router's entry with the new request. The slot is
# free when the adapter is already running there or fewer distinct adapters than the slots run there
# (this router's and every live peer's): then the entry is stored and published (WRITE's effect) and
# {1} returned, else {0, the peers' entries} for the caller to decide again on.
CLAIM = (
    PRELUDE
    + """
prune()
local taken, n = {}, 0
for _, a in ipairs(cjson.decode(ARGV[5])) do
  if not taken[a] then taken[a] = true; n = n + 1 end
end
local all = redis.call('HGETALL', KEYS[1])
local others = {}
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] then
    table.insert(others, all[i + 1])
    local ok, e = pcall(cjson.decode, all[i + 1])
    if ok and type(e) == 'table' and type(e.b) == 'table' and type(e.b[ARGV[2]]) == 'table' then
      local active = e.b[ARGV[2]][3]
      if type(active) == 'table' then
        for a, c in pairs(active) do
          if tonumber(c) and tonumber(c) > 0 and not taken[a] then taken[a] = true; n = n + 1 end
        end
      end
    end
  end
end
if taken[ARGV[3]] or n < tonumber(ARGV[4]) then
  store(ARGV[1], ARGV[8], tonumber(ARGV[6]), ARGV[7])
  return {1}
end
table.insert(others, 1, 0)
return others
"""
)

# ARGV[1] the router. A router that stops takes its entry out at once.
REMOVE = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""


def redacted(url: str) -> str:
    """``url`` without its credentials, for logs and messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def router_id(settings: RouterSettings) -> str:
    """This router's name in the store: its Pod, else a unique name (two local routers never collide)."""
    if settings.pod:
        return settings.pod
    return f"{os.uname().nodename}:{settings.port}:{uuid.uuid4().hex[:8]}"


class SharedBooks:
    """Writes this router's books, hears and resyncs the peers' (module docstring); ``run`` until stopped."""

    def __init__(
        self,
        settings: RouterSettings,
        scheduler: Scheduler,
        telemetry: Telemetry,
        *,
        on_state: Callable[[BooksState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert settings.shared_state is not None
        self.settings, self.scheduler, self.telemetry = settings, scheduler, telemetry
        self.on_state, self.clock = on_state, clock
        self.me = router_id(settings)
        self.interval_s = settings.shared_state_interval_s
        self.deadline_s = settings.shared_state_deadline_s
        self.ttl_s = TTL_INTERVALS * self.interval_s
        prefix = f"lorapool:{{{settings.shared_state_key}}}"
        self.keys = [f"{prefix}:books", f"{prefix}:expiry"]
        self.channel = f"{prefix}:changes"
        self.peers = PeerBooks(self.me, self.ttl_s)
        self.state = BooksState(up=False, error="not connected yet", since=time.time())
        self.client = aioredis.Redis.from_url(
            settings.shared_state,
            username=os.environ.get(USERNAME_ENV) or urlsplit(settings.shared_state).username,
            password=os.environ.get(PASSWORD_ENV) or urlsplit(settings.shared_state).password,
            socket_timeout=max(1.0, 20 * self.deadline_s),
            socket_connect_timeout=max(0.5, 10 * self.deadline_s),
        )
        self._write, self._read = self.client.register_script(WRITE), self.client.register_script(READ)
        self._claim = self.client.register_script(CLAIM)
        self._dirty = asyncio.Event()
        self._seq = 0
        scheduler.peers = self.peers
        scheduler.books_changed = self._dirty.set
        scheduler.books_up = False
        scheduler.claim_slot = self.claim

    # --- the loops ------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Write, hear and resync until ``stop``; then take this router's entry out of the store."""
        tasks = [asyncio.ensure_future(t) for t in (self._writer(stop), self._resync(stop), self._hear(stop))]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                remove = self.client.register_script(REMOVE)
                await asyncio.wait_for(remove(keys=self.keys, args=[self.me]), 1.0)
            await self.client.aclose()

    async def _writer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.interval_s)
            if self._dirty.is_set():  # linger: the changes of the next few ms go in the same write
                await asyncio.sleep(LINGER_S)
            self._dirty.clear()
            await self.write()

    async def _resync(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.resync()
            await asyncio.sleep(self.interval_s)

    async def _hear(self, stop: asyncio.Event) -> None:
        """Fold in each entry published on the channel; on a lost connection, subscribe again."""
        while not stop.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await asyncio.wait_for(pubsub.subscribe(self.channel), max(self.deadline_s, 1.0))
                while not stop.is_set():
                    message = await pubsub.get_message(timeout=self.interval_s)
                    entry = decode(message["data"]) if message is not None else None
                    if entry is not None:
                        self._fold(self.peers.update(entry, self.clock()))
            except (RedisError, OSError, TimeoutError) as exc:
                self.telemetry.shared_books_errors.labels("subscribe").inc()
                log.debug("Shared books subscription lost", extra={"kv": {"error": _reason(exc)}})
                await asyncio.sleep(self.interval_s)
            finally:
                with contextlib.suppress(RedisError, OSError, TimeoutError, RuntimeError):
                    await asyncio.wait_for(pubsub.aclose(), 0.5)

    # --- one step each (tests drive them) ------------------------------------------------
    async def write(self) -> bool:
        """Store this router's entry now; False (and the store is down) when it failed or ran late."""
        self._seq += 1
        entry = encode(self.scheduler.books(self.me, self._seq))
        ttl_ms = int(self.ttl_s * 1000)
        return await self._call(
            "write", lambda: self._write(keys=self.keys, args=[entry, ttl_ms, self.channel, self.me])
        )

    async def claim(self, backend: str, adapter: str, slots: int, others: list[str]) -> bool:
        """Claim a free LoRA slot of ``backend`` for ``adapter`` (``others``: this router's other adapters
        there) with this router's entry, which already counts the request. False when another router's
        claim took it first: the peers' entries it answered with are folded in for the next decision.
        A store that does not answer within ``CLAIM_DEADLINE_S`` leaves the bind standing."""
        self._seq += 1
        entry = encode(self.scheduler.books(self.me, self._seq))
        args: list[str | int | bytes] = [
            self.me, backend, adapter, slots, json.dumps(others), int(self.ttl_s * 1000), self.channel, entry
        ]  # fmt: skip
        try:
            answer = await asyncio.wait_for(
                self._claim(keys=self.keys, args=args), min(self.deadline_s, CLAIM_DEADLINE_S)
            )
        except (TimeoutError, RedisError, OSError):
            self.telemetry.shared_books_errors.labels("claim").inc()
            return True
        if answer and int(answer[0]) == 1:
            return True
        now = self.clock()
        changed = False
        for raw in answer[1:]:
            entry_ = decode(raw)
            changed = (entry_ is not None and self.peers.update(entry_, now)) or changed
        self._fold(changed)
        return False

    async def resync(self) -> bool:
        """Replace the peers by the store's live entries; when the store cannot answer, drop those past
        their TTL here. True when the store answered."""
        raw: list[Any] = []

        async def read() -> None:
            raw.extend(await self._read(keys=self.keys))

        answered = await self._call("read", read)
        now = self.clock()
        if answered:
            entries = [e for e in (decode(r) for r in raw) if e is not None]
            changed = self.peers.replace_all(entries, now)
        else:
            changed = self.peers.expire(now)
        self._fold(changed)
        self._set_state(self.state.up, self.state.error)
        return answered

    def _fold(self, changed: bool) -> None:
        """Tell the scheduler when the peers' books changed or brought fair dispatch service to add."""
        if changed or self.peers.has_service():
            self.scheduler.peers_changed()

    async def _call(self, op: str, call: Callable[[], Awaitable[Any]]) -> bool:
        started = self.clock()
        try:
            await asyncio.wait_for(call(), self.deadline_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.telemetry.shared_books_errors.labels(op).inc()
            self._set_state(False, f"{op}: {_reason(exc)}")
            return False
        self.telemetry.shared_books_seconds.labels(op).observe(self.clock() - started)
        self._set_state(True, "")
        return True

    def _set_state(self, up: bool, error: str) -> None:
        peers = len(self.peers)
        self.scheduler.books_up = up
        self.telemetry.shared_books_up.set(1 if up else 0)
        self.telemetry.shared_books_peers.set(peers)
        if up == self.state.up and peers == self.state.peers and (up or error == self.state.error):
            return
        if up != self.state.up:
            url = redacted(self.settings.shared_state or "")
            if up:
                log.info("Shared books reachable", extra={"kv": {"store": url, "peers": peers}})
            else:
                log.warning(
                    "Shared books unreachable: deciding from this router's books and the engines' metrics",
                    extra={"kv": {"store": url, "error": error}},
                )
        since = time.time() if up != self.state.up else self.state.since
        self.state = BooksState(up, peers, "" if up else error, since)
        if self.on_state is not None:
            self.on_state(self.state)


def _reason(exc: BaseException) -> str:
    """A store error in a few words, never with credentials (redis-py's messages hold none)."""
    if isinstance(exc, TimeoutError):
        return "no answer within the deadline"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
