"""``--policy-file``: read the router policy document, and re-read it when the ConfigMap changes.

Shell, as ``trafficfile``: the kubelet swaps a ConfigMap volume's files in place (a symlink flip), so
the file is read again every poll interval and, when its bytes differ, parsed (``api.routerpolicy``),
overridden by the flags given beside it (``core.document.Overrides``), built
(``core.document.build``, ``core.document.knobs``) and swapped in through ``Scheduler.set_policy``:
the chain, and the dispatch knobs and slots. A bad file at start stops
the router with the error (exit 2: a typo must not start a pool on a policy nobody asked for); a bad
file later is logged, counted (``lorapool_router_policy_reloads_total{result="refused"}``) and
published on the router's Pod (``publisher.PolicyPublisher``, the pool's ``RouterPolicyAccepted``
condition), and the last good document stays in force. ``lorapool_router_policy_info{hash}`` says
which document runs: the hash of the document after the flags' overrides, so a file the operator
wrote and no flag changed has the hash of the file's bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import ValidationError

from lorapool.api.routerpolicy import PolicyState, RouterPolicyDocument, document_hash, problems
from lorapool.router.core.document import Chain, Overrides, SchedulerKnobs, apply, flags_document, knobs, resolve
from lorapool.router.core.document import build as build_scheduling
from lorapool.router.core.policy import Scheduling
from lorapool.router.livefile import LiveFile
from lorapool.router.telemetry import Telemetry

log = logging.getLogger("lorapool.router.policy")


@dataclass(frozen=True)
class Loaded:
    """A document the router can run: as read, after the flags, resolved and built."""

    document: RouterPolicyDocument  # after the overrides
    chain: Chain
    scheduling: Scheduling
    source: str  # "file" or "flags"
    knobs: SchedulerKnobs  # the document's dispatch and slots

    @property
    def hash(self) -> str:
        return self.document.hash


def load(document: RouterPolicyDocument, overrides: Overrides, source: str) -> Loaded:
    """``document`` with ``overrides`` over it, built; raises ValueError naming the field or flag and the fix."""
    effective = apply(document, overrides)
    return Loaded(effective, resolve(effective), build_scheduling(effective), source, knobs(effective))


def from_flags(overrides: Overrides) -> Loaded:
    """The policy the flags alone describe (no ``--policy-file``); raises ValueError as the flags' parser would."""
    return load(flags_document(overrides), Overrides(), "flags")


def parse(path: Path, data: bytes, overrides: Overrides) -> Loaded:
    """The policy in ``data`` (read from ``path``); raises ValueError naming the file and what is wrong."""
    try:
        document = RouterPolicyDocument.from_json(data)
    except ValidationError as exc:
        raise ValueError(f"--policy-file {path} is not a router policy (api.routerpolicy): {problems(exc)}") from None
    try:
        return load(document, overrides, "file")
    except ValueError as exc:
        raise ValueError(f"--policy-file {path}: {exc}") from None


def read(path: Path, overrides: Overrides) -> tuple[bytes, Loaded]:
    """The file's bytes and policy; raises ValueError naming the file and what is wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"--policy-file {path}: cannot read it: {exc.strerror or exc}") from None
    return data, parse(path, data, overrides)


class PolicyFile(LiveFile):
    """Keeps ``path``'s policy in force: ``reread`` applies a changed valid file, keeps the last good one
    on a bad edit, and says which runs (the metric, ``state``, ``on_state`` for the publisher)."""

    def __init__(
        self,
        path: Path,
        overrides: Overrides,
        set_policy: Callable[[Scheduling, SchedulerKnobs], None],
        telemetry: Telemetry,
        *,
        first: tuple[bytes, Loaded] | None = None,
    ) -> None:
        """``first``: the file as already read at start (``read``), else read now (ValueError if bad)."""
        seen, self.running = first if first is not None else read(path, overrides)
        super().__init__(path, seen, "router policy", log)
        self.overrides, self.set_policy, self.telemetry = overrides, set_policy, telemetry
        self.state = PolicyState(self.running.hash)
        self.on_state: Callable[[PolicyState], None] | None = None
        telemetry.policy_running(self.running.hash, self.running.chain.name, "file")

    def reread(self) -> bool:
        """Read the file again; True when a changed, valid policy was applied."""
        if (data := self.changed()) is None:
            return False
        try:
            loaded = parse(self.path, data, self.overrides)
        except ValueError as exc:
            log.warning(
                "Kept the last good router policy",
                extra={"kv": {"error": str(exc), "running": self.running.hash, "refused": document_hash(data)}},
            )
            self.telemetry.policy_reloads.labels("refused").inc()
            self._publish(PolicyState(self.running.hash, refused=document_hash(data), reason=str(exc)))
            return False
        self.set_policy(loaded.scheduling, loaded.knobs)
        self.running = loaded
        self.telemetry.policy_reloads.labels("applied").inc()
        self.telemetry.policy_running(loaded.hash, loaded.chain.name, "file")
        log.info("Applied new router policy", extra={"kv": summary(loaded)})
        self._publish(PolicyState(loaded.hash))
        return True

    def _publish(self, state: PolicyState) -> None:
        self.state = state
        if self.on_state is not None:
            self.on_state(state)


def summary(loaded: Loaded) -> dict[str, object]:
    """What a log line says of a policy: its name, hash, source, chain, dispatch knobs and slots."""
    return {
        "policy": loaded.chain.name,
        "hash": loaded.hash,
        "source": loaded.source,
        "chain": loaded.chain.describe(),
        "knobs": asdict(loaded.knobs),
    }
