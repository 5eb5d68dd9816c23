"""What real-engine tests share: find the engine (fail in CI, skip elsewhere), start one, tidy up.

Used by ``tests/engine``, ``tests/conformance`` and any later test that runs real vLLM (the
sidecar and router against real engines). Tests that need the engine carry ``@pytest.mark.engine``.

    install = engine_or_skip()                      # pytest.fail when $CI is set, else pytest.skip
    with started("vllm", cfg, install=install) as proc: ...

Rule (issue 9): in CI a missing or broken engine is a failure, never a skip; on a developer's
machine without ``lorapool engine install`` the tests skip and say how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import pytest

from lorapool_dev.engine.install import EngineInstall, find_engine
from lorapool_dev.engine.parsers import ParserVenv, find_parser
from lorapool_dev.engine.server import EngineKind, ServeConfig, start_engine, stop_engine
from lorapool_dev.testing.processes import ProcessError, RunningProcess, descendants, kill_all, start_time

INSTALL_HINT = "run `lorapool engine install` (once, a few minutes, cached in ~/.cache/lorapool/engine)"


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def missing(message: str) -> NoReturn:
    """A prerequisite is missing: pytest.fail under CI (it must provide it), pytest.skip elsewhere."""
    if in_ci():
        pytest.fail(f"CI is set and {message}", pytrace=False)
    pytest.skip(message)


def engine_or_skip() -> EngineInstall:
    """The installed engine; without it: pytest.fail in CI, pytest.skip (saying how) elsewhere."""
    install = find_engine()
    if install is not None:
        return install
    missing(f"vLLM CPU engine not installed; {INSTALL_HINT}")


def parser_or_skip(version: str) -> ParserVenv:
    """vLLM ``version``'s parser venv; without it: pytest.fail in CI, pytest.skip (saying how) elsewhere."""
    venv = find_parser(version)
    if venv is not None:
        return venv
    missing(f"vLLM {version}'s CLI parser not installed; run `lorapool engine install && lorapool engine parsers`")


@contextmanager
def started(
    kind: EngineKind,
    cfg: ServeConfig,
    *,
    install: EngineInstall | None = None,
    sim_extra: Sequence[str] = (),
) -> Iterator[RunningProcess]:
    """Start ``kind`` for a test; a start failure fails the test with the engine's output (never skips).

    On exit the engine and every process it started are stopped (``stop_engine``).
    """
    try:
        proc = start_engine(kind, cfg, install=install, sim_extra=sim_extra)
    except ProcessError as exc:
        pytest.fail(f"{kind} did not start: {exc}", pytrace=False)
    # The tree now, while it is whole: a test that signals the server itself (SIGTERM, SIGKILL) leaves
    # its engine core reparented, out of stop_engine's sight, and still holding memory and cores.
    tree = [(pid, start_time(pid)) for pid in descendants(proc.pid)]
    try:
        yield proc
    finally:
        stop_engine(proc)
        proc.close()
        kill_all(tree)
