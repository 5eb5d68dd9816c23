"""Several engine replicas on one machine: their configs (pure) and a parallel start (shell).

Used by the router tests against real vLLM, ``lorapool dev --engine vllm`` and the real-engine
benchmark cell. Two vLLM servers on a 2-core machine must not pin their compute threads to the
same core (vLLM's "auto" binding puts every server on core 0), so replica ``i`` gets core
``i % cores``; starting them at once takes ~50 s instead of ~2 x 40 s.

    cfgs = replica_configs(ServeConfig(model=..., port=0, max_loras=2), count=2)
    procs = start_engines("vllm", cfgs)       # all healthy, or none left running
    try: ...
    finally: stop_engines(procs)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from lorapool_dev.engine.install import EngineInstall, require_engine
from lorapool_dev.engine.server import EngineKind, ServeConfig, start_engine, stop_engine
from lorapool_dev.testing.processes import RunningProcess, free_port


def replica_configs(
    template: ServeConfig, count: int, *, cores: int | None = None, ports: Sequence[int] | None = None
) -> list[ServeConfig]:
    """``count`` copies of ``template``, each with its own port and CPU core. Pure when ``ports`` is given."""
    if count < 1:
        raise ValueError(f"replicas={count}: start at least one engine replica")
    ncores = max(1, cores if cores is not None else (os.cpu_count() or 1))
    chosen = list(ports) if ports is not None else [free_port() for _ in range(count)]
    if len(chosen) != count:
        raise ValueError(f"{len(chosen)} ports for {count} replicas: give one port per replica")
    return [dataclasses.replace(template, port=port, cpu_threads_bind=str(i % ncores)) for i, port in enumerate(chosen)]


def start_engines(
    kind: EngineKind,
    cfgs: Sequence[ServeConfig],
    *,
    install: EngineInstall | None = None,
    start: Callable[..., RunningProcess] = start_engine,
) -> list[RunningProcess]:
    """Start every replica at once; return them once all answer ``/health``.

    If one fails to start, the others are stopped and the first error is raised: never a
    half-started set left running.
    """
    engine = install or (require_engine() if kind == "vllm" else None)
    with ThreadPoolExecutor(max_workers=max(1, len(cfgs))) as pool:
        futures = [pool.submit(start, kind, cfg, install=engine) for cfg in cfgs]
    started: list[RunningProcess] = []
    errors: list[BaseException] = []
    for future in futures:
        exc = future.exception()
        if exc is None:
            started.append(future.result())
        else:
            errors.append(exc)
    if errors:
        stop_engines(started)
        raise errors[0]
    return started


def stop_engines(procs: Sequence[RunningProcess]) -> None:
    """Stop each replica and its whole process tree (``stop_engine``), in parallel."""
    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        list(pool.map(stop_engine, procs))
    for proc in procs:
        proc.close()
