"""Keep backends that serve the requested model (adapter or base), as /v1/models says.

Keeps: backends whose model list has ``req.model``, and backends not polled yet (``models`` is
None), so a fresh router does not answer 404 before its first poll. Reads: ``models``,
``model``. An empty result means no live replica serves the model: admission asks the
sidecars' reports where it stands (loading: hold; failed or unknown: 404).
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import FilterPlugin


def serves_model(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
    """Backends whose model list includes ``req.model`` (or is not known yet)."""
    return [b for b in backends if b.models is None or req.model in b.models]


PLUGIN = FilterPlugin("serves-model", lambda _params: serves_model, reads=("models", "model"))
