"""Carry out one adapter action ``core.diff`` decided: a ``Load`` or an ``Unload``. Shell.

``agent.Agent`` spawns one asyncio task per action, so one slow or failing adapter never blocks
the others, and each task runs ``Executor.load`` or ``Executor.unload``. A load downloads the
adapter (``lorapool.sources``, downloads sharing the downloader's semaphore) unless the store
kept its files from an earlier unload, verifies it against the pool's checks
(``core.check_adapter``), loads it into the engine and points the store at it; an unload
removes it from the engine and keeps its files in the store within the ``keep.KeepBudget``
(``keep.evictions`` decides which kept files go), or deletes them when keeping is off. Each
step is written into the shared ``state`` (the phase /status and the Pod report show), and a
failure is read by its type into a ``retry.Failure`` whose retry ``retry.after_failure``
decides: a bad adapter is Failed with a message that says what to fix, and retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lorapool.api.adapterset import AdapterSet, DesiredAdapter
from lorapool.api.peft import parse_adapter_config
from lorapool.api.report import ReplicaPhase as Phase
from lorapool.errors import AdapterError, SourceError, UnsafePathError
from lorapool.sidecar.core import UNLOAD, AdapterState, Load, Unload, check_adapter, identity_of, loaded_state
from lorapool.sidecar.engine import EngineClient, EngineError
from lorapool.sidecar.keep import KeepBudget, evictions
from lorapool.sidecar.metrics import SidecarMetrics
from lorapool.sidecar.retry import Backoff, Failure, about, after_failure, after_unload, internal_failure
from lorapool.sources import AdapterStore, ChecksumMismatch, Downloader, Fetched, redact_url
from lorapool.sources.layout import CONFIG_FILE
from lorapool.sources.store import KeptTree

log = logging.getLogger("lorapool.sidecar")


class _Refused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, _Refused):
        return exc.reason
    if isinstance(exc, ChecksumMismatch):
        return "checksum"
    if isinstance(exc, UnsafePathError):
        return "unsafe"
    if isinstance(exc, AdapterError):
        return "invalid"
    if isinstance(exc, SourceError):
        return "download"
    if isinstance(exc, EngineError):
        return "engine"
    return "internal"


def _transient(exc: BaseException) -> bool:
    """Whether retrying the same thing soon can succeed (the shell's reading of the error types).

    SourceError and EngineError say so themselves (the engine client reads vLLM's status and
    message: no answer, 429 or 5xx may recover, a 4xx or a worker's refusal of the adapter will
    not); a refused or unsafe adapter and a checksum mismatch stay as they are until the desired
    entry changes. Unknown errors (bugs) keep the exponential backoff.
    """
    if isinstance(exc, SourceError | EngineError):
        return exc.transient
    return not isinstance(exc, _Refused | AdapterError)


def _failure(name: str, exc: BaseException, *, reason: str | None = None) -> Failure:
    """What ``exc`` says went wrong with adapter ``name`` (``reason`` overrides the kind it reads)."""
    return Failure(reason or _failure_reason(exc), about(name, str(exc)), transient=_transient(exc))


class Executor:
    """Runs load and unload actions and records what each did in the agent's ``state``.

    ``engine`` and ``pool`` are read when they are needed: the engine client exists once the
    agent runs, and a config re-read may replace the pool while a download is under way."""

    def __init__(
        self,
        state: dict[str, AdapterState],
        store: AdapterStore,
        downloader: Downloader,
        metrics: SidecarMetrics,
        *,
        engine: Callable[[], EngineClient],
        pool: Callable[[], AdapterSet | None],
        clock: Callable[[], float],
        rng: random.Random,
        backoff: Backoff,
        keep: KeepBudget | None = None,
    ) -> None:
        self.state = state
        self.store = store
        self.downloader = downloader
        self.metrics = metrics
        self._engine = engine
        self._pool = pool
        self.clock = clock
        self.rng = rng
        self.backoff = backoff
        self.keep = keep or KeepBudget()

    def _set(self, name: str, **changes: Any) -> None:
        if name in self.state:
            self.state[name] = replace(self.state[name], **changes)

    async def load(self, action: Load) -> None:
        """Download, verify, load into the engine, point the store at it; a failure backs off by kind."""
        name, adapter = action.name, action.adapter
        want = identity_of(adapter)
        self._set(name, source=redact_url(adapter.source), revision=adapter.revision)
        if not action.inplace:  # a hot swap keeps showing the serving phase until it downloads
            self._set(name, phase=Phase.PENDING)
        fetched = None
        try:
            if not action.inplace and self.keep.on:  # a hot swap points the store only once the engine has it
                await asyncio.to_thread(self._take_kept, name, want)
            fetched = await self._download(name, adapter)
            rank = self._verify(name, fetched)
            path = str(fetched.path)
            await self._engine_load(name, path, inplace=action.inplace)
            await asyncio.to_thread(self.store.point, name, fetched.origin)
            self._loaded(action, want, path, rank)
            self._set(name, resolved=fetched.origin.resolved_revision)
        except asyncio.CancelledError:
            raise
        except (_Refused, AdapterError, SourceError, EngineError) as exc:
            self._fail(name, want, _failure(name, exc))
        except Exception as exc:  # a bug must not take the other adapters down
            log.exception("Adapter action crashed", extra={"kv": {"adapter": name}})
            self._fail(name, want, internal_failure(name, type(exc).__name__, str(exc)))
        finally:
            if fetched is not None:
                self.downloader.release(fetched)
            await asyncio.to_thread(self.tidy)

    async def _download(self, name: str, adapter: DesiredAdapter) -> Fetched:
        fetched = await self.downloader.fetch(
            name,
            adapter.source,
            revision=adapter.revision,
            sha256=adapter.sha256,
            on_downloading=lambda: self._set(name, phase=Phase.DOWNLOADING),
        )
        if not fetched.cached:
            self.metrics.download_bytes.inc(fetched.bytes)
            self.metrics.download_seconds.observe(fetched.seconds)
            log.info(
                "Downloaded adapter",
                extra={
                    "kv": {
                        "adapter": name,
                        "source": redact_url(adapter.source),
                        "bytes": fetched.bytes,
                        "seconds": round(fetched.seconds, 3),
                        "digest": fetched.origin.digest[:12],
                        "resolved": fetched.origin.resolved_revision,
                    }
                },
            )
        return fetched

    def _verify(self, name: str, fetched: Fetched) -> int:
        """The adapter's rank, or _Refused when the pool's checks refuse it (its rank is shown either way)."""
        pool = self._pool()
        assert pool is not None
        self._set(name, phase=Phase.VERIFYING)
        config = parse_adapter_config(fetched.config, where=f"adapter {name!r}: {CONFIG_FILE}")
        self._set(name, rank=config.rank)  # shown even when the checks below refuse it
        if problems := check_adapter(name, config, pool):
            raise _Refused(problems[0].reason, "; ".join(p.message for p in problems))
        self._set(name, phase=Phase.LOADING, rank=config.rank)
        return config.rank

    async def _engine_load(self, name: str, path: str, *, inplace: bool) -> None:
        engine = self._engine()
        try:
            await engine.load(name, path, inplace=inplace)
        except EngineError as exc:
            if exc.status != 400 or "already loaded" not in str(exc):
                raise
            await engine.load(name, path, inplace=True)  # someone loaded it meanwhile

    def _loaded(self, action: Load, want: str, path: str, rank: int) -> None:
        name, adapter = action.name, action.adapter
        self.state[name] = loaded_state(action, want, path, rank, source=redact_url(adapter.source), now=self.clock())
        self.metrics.loads.labels(reason=str(action.reason)).inc()
        log.info(
            "Reloaded adapter" if action.inplace else "Loaded adapter",
            extra={
                "kv": {
                    "adapter": name,
                    "revision": adapter.revision,
                    "rank": rank,
                    "path": path,
                    "reason": str(action.reason),
                }
            },
        )

    def _fail(self, name: str, failed: str, failure: Failure) -> None:
        retry = after_failure(
            self.state.get(name) or AdapterState(name), failed, failure, self.clock(), self.rng, self.backoff
        )
        self.state[name] = retry.state
        self.metrics.failures.labels(reason=failure.reason).inc()
        log.warning(
            "Failed adapter action",
            extra={
                "kv": {
                    "adapter": name,
                    "reason": failure.reason,
                    "error": retry.state.error,
                    "attempts": retry.state.attempts,
                    "transient": failure.transient,
                    "retryInSeconds": round(retry.delay_s, 2),
                }
            },
        )

    async def unload(self, action: Unload) -> None:
        """Remove the adapter from the store and, when it is there, from the engine."""
        name = action.name
        self._set(name, phase=Phase.UNLOADING)
        try:
            await asyncio.to_thread(self._keep_or_remove, name)
            if not action.in_engine:
                self.state.pop(name, None)
                return
            await self._engine().unload(name)
            self.metrics.unloads.inc()
            log.info("Unloaded adapter", extra={"kv": {"adapter": name}})
            st = self.state.get(name) or AdapterState(name)
            self.state[name] = after_unload(st, self.clock(), self.rng, self.backoff).state
        except asyncio.CancelledError:
            raise
        except (EngineError, UnsafePathError) as exc:
            self._fail(name, UNLOAD, _failure(name, exc, reason="unload"))
        finally:
            await asyncio.to_thread(self.tidy)

    # ---- kept files (blocking: called in a thread) -----------------------------------------

    def _take_kept(self, name: str, identity: str) -> None:
        """Point ``<name>`` at files kept for this identity, so the download below finds them in the store."""
        if (tree := self.store.take_kept(name, identity)) is None:
            return
        self.metrics.kept_hits.inc()
        log.info("Reused kept adapter files", extra={"kv": _kept_fields(name, tree)})

    def _keep_or_remove(self, name: str) -> None:
        if not self.keep.on:
            self.store.remove(name)
        elif (tree := self.store.keep(name, now=self.clock())) is not None:
            log.debug("Kept adapter files", extra={"kv": _kept_fields(name, tree)})

    def tidy(self) -> None:
        """Evict the kept files ``keep.evictions`` names, delete what nothing uses, update the gauge."""
        kept = {tree.identity: tree for tree in self.store.kept()}
        drop = evictions(list(kept.values()), self.store.in_use(), now=self.clock(), budget=self.keep)
        self.store.forget([kept[e.identity] for e in drop])
        for eviction in drop:
            tree = kept.pop(eviction.identity)
            self.metrics.kept_evictions.labels(reason=str(eviction.reason)).inc()
            fields = {**_kept_fields(tree.name, tree), "reason": str(eviction.reason)}
            log.info("Evicted kept adapter files", extra={"kv": fields})
        self.store.gc()
        self.metrics.kept_bytes.set(sum(tree.bytes for tree in kept.values()))


def _kept_fields(name: str, tree: KeptTree) -> dict[str, Any]:
    return {"name": name, "identity": tree.identity[:12], "bytes": tree.bytes, "digest": tree.digest[:12]}
