"""The operator's read of each adapter's adapter_config.json (its rank, base model, kind), per pool.

The operator reads sources with the pool's non-secret source settings (the registries it names as
plain HTTP), never with its Secrets: it has no RBAC to read them (least privilege), the sidecars do
the authenticated download. So a source that needs the pool's login is unreadable here, and the
verdict says why instead of blaming a setting the pool already has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Protocol

from lorapool.api.models import LoRAPool
from lorapool.api.pool import OciCredentials
from lorapool.controller.decide import Fetched
from lorapool.errors import LoRAPoolError, SourceError
from lorapool.plan.adapters import PoolAdapter
from lorapool.sources.base import SourceOptions


class ConfigFetcher(Protocol):
    """async (source, revision, options) -> the adapter_config.json object (``sources.config``)."""

    def __call__(self, source: str, revision: str | None, *, options: SourceOptions) -> Awaitable[dict[str, Any]]: ...


def _oci(pool: LoRAPool) -> OciCredentials | None:
    return pool.spec.credentials.oci if pool.spec.credentials else None


def source_options(pool: LoRAPool) -> SourceOptions:
    """The pool's settings the operator may use to read its sources: the plain-HTTP registries."""
    oci = _oci(pool)
    return SourceOptions(oci_plain_http=frozenset(oci.plain_http) if oci else frozenset())


def _login_note(pool: LoRAPool, source: str) -> str:
    oci = _oci(pool)
    if source.startswith("oci://") and oci is not None and oci.secret_name:
        return f"; the operator reads registries without {oci.secret_name} (it reads no Secrets), the sidecars log in"
    return ""


async def fetch_adapter_metadata(
    pool: LoRAPool, adapter: PoolAdapter, fetch: ConfigFetcher, timeout_s: float
) -> Fetched:
    """Read one adapter's adapter_config.json; a source that fails is a fact for ``decide``, never a crash."""
    spec = adapter.spec
    try:
        read = fetch(spec.source, spec.revision, options=source_options(pool))
        return Fetched(config=await asyncio.wait_for(read, timeout_s))
    except (SourceError, TimeoutError, OSError) as exc:
        return Fetched(unreadable=(str(exc) or f"timed out after {timeout_s:g}s") + _login_note(pool, spec.source))
    except LoRAPoolError as exc:
        return Fetched(refused=str(exc))
