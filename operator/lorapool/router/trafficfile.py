"""``--traffic-file``: read the pool's traffic document, and re-read it when the ConfigMap changes.

Shell. Re-read as a ``livefile.LiveFile`` (every poll interval, applied when its bytes differ). A bad file at start stops the router
with the error (a typo must not start a pool without its limits); a bad file later is logged and
the last good policy stays in force, so a broken edit never drops every limit at once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from lorapool.api.traffic import TrafficPolicy
from lorapool.router.livefile import LiveFile
from lorapool.router.scheduler import Scheduler

log = logging.getLogger("lorapool.router.traffic")


def read_policy(path: Path) -> tuple[bytes, TrafficPolicy]:
    """The file's bytes and policy; raises ValueError naming the file and what is wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"--traffic-file {path}: cannot read it: {exc.strerror or exc}") from None
    return data, parse_policy(path, data)


def parse_policy(path: Path, data: bytes) -> TrafficPolicy:
    """The policy in ``data`` (read from ``path``); raises ValueError naming the file and the fields."""
    try:
        return TrafficPolicy.from_json(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--traffic-file {path} is not a traffic policy (api.traffic): {problems}") from None


class TrafficFile(LiveFile):
    """Applies ``path``'s policy to the scheduler now, then whenever the file changes."""

    def __init__(self, path: Path, scheduler: Scheduler) -> None:
        seen, policy = read_policy(path)
        super().__init__(path, seen, "traffic policy", log)
        self.scheduler = scheduler
        scheduler.set_traffic(policy)
        log.info("Read traffic policy", extra={"kv": _summary(policy)})

    def reread(self) -> bool:
        """Read the file again; True when a changed, valid policy was applied."""
        if (data := self.changed()) is None:
            return False
        try:
            policy = parse_policy(self.path, data)
        except ValueError as exc:
            log.warning("Kept the last good traffic policy", extra={"kv": {"error": str(exc)}})
            self.scheduler.telemetry.traffic_reloads.labels("refused").inc()
            return False
        self.scheduler.set_traffic(policy)
        self.scheduler.telemetry.traffic_reloads.labels("applied").inc()
        log.info("Applied new traffic policy", extra={"kv": _summary(policy)})
        return True


def _summary(policy: TrafficPolicy) -> dict[str, object]:
    limited = sum(t.limits is not None for t in policy.adapters.values())
    return {"adapters": len(policy.adapters), "limited": limited, "routers": policy.routers}
