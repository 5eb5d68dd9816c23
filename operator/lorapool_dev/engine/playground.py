"""The playground's data plane on real vLLM (``lorapool dev --engine vllm``).

Called by ``lorapool_dev.dev.playground`` only. A pool names a real base model (say Llama-3-8B) that this
machine cannot run, so each engine pod gets a CPU ``vllm serve`` of the tiny local Llama
(``tinymodel``) under the pool's base-model name, with the pool's planned ``--max-loras``,
``--max-lora-rank`` and ``--max-cpu-loras``. Adapter sources the machine cannot reach become
local PEFT adapters *for the tiny model* (same name and rank, the pool's base model recorded),
so the sidecar's checks and vLLM's own loading run for real. The engine is installed first
when it is missing (``lorapool engine install``: a few minutes once, cached).

    start = prepare_real_engine(pool_doc, state_dir, say=print)   # before the pool is applied
    engine = start(served_model_name=..., max_loras=2, max_lora_rank=16, max_cpu_loras=4)
    engine.url ... engine.close()                                  # stops vLLM's whole process tree
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from lorapool_dev.engine.install import EngineInstall, find_engine, install_engine
from lorapool_dev.engine.server import ServeConfig, start_engine, stop_engine
from lorapool_dev.engine.tinymodel import DEFAULT_SPEC, ensure_tiny_model, write_tiny_adapter
from lorapool_dev.testing.components import Component
from lorapool_dev.testing.processes import free_port

LOCAL_SCHEMES = ("file://", "pvc://")
START_TIMEOUT_S = 300.0  # one vLLM CPU start: ~40-65 s on 2 cores, more while others start


class StartEngine(Protocol):
    """What ``LocalEngines`` calls per engine pod: ``start_sim``'s flags, a running engine back."""

    def __call__(
        self,
        *,
        served_model_name: str,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int | None = None,
        timeout_s: float = ...,
    ) -> Component: ...


class EngineComponent(Component):
    """A vLLM replica: ``close`` stops its API server, engine core and worker (``stop_engine``)."""

    def close(self) -> None:
        stop_engine(self.proc)
        self.proc.close()


def stand_in_note(base_model: str) -> str:
    """What the user must know about the engines, said once in the output. Pure."""
    s = DEFAULT_SPEC
    return (
        f"Engines: real vLLM (CPU) replicas serving a TINY random-weight Llama ({s.num_layers} layers, "
        f"hidden {s.hidden_size}) under the name {base_model!r}; {base_model} itself is not loaded. "
        "Answers are nonsense text, but loading, LoRA slots, batching, errors and /metrics are vLLM's own"
    )


def tiny_sources(pool_doc: dict[str, Any], out_dir: Path) -> list[tuple[str, str, int]]:
    """Point each adapter the machine cannot fetch at a local tiny-model adapter of the same rank.

    Mutates ``pool_doc``; returns (name, old source, rank) for what it replaced. ``file://``
    and ``pvc://`` sources are kept: they must then hold adapters for the tiny model.
    """
    base = str(pool_doc["spec"]["baseModel"]["name"])
    replaced: list[tuple[str, str, int]] = []
    for seed, adapter in enumerate(pool_doc["spec"].get("adapters") or [], start=1):
        if str(adapter["source"]).startswith(LOCAL_SCHEMES):
            continue
        rank = int(adapter.get("rank") or 8)
        path = write_tiny_adapter(out_dir / adapter["name"], rank=rank, seed=seed, base_model=base)
        replaced.append((adapter["name"], str(adapter["source"]), rank))
        adapter["source"] = path.resolve().as_uri()
    return replaced


def engine_starter(model: Path, install: EngineInstall, *, cores: int | None = None) -> StartEngine:
    """A ``StartEngine`` for ``model``: each replica on its own port and, in turn, its own CPU core."""
    ncores = max(1, cores or os.cpu_count() or 1)
    turn: Iterator[int] = itertools.count()
    lock = threading.Lock()

    def start(
        *,
        served_model_name: str,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> Component:
        with lock:
            core = next(turn) % ncores
        cfg = ServeConfig(
            model=str(model), port=free_port(), served_model_name=served_model_name, max_loras=max_loras,
            max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras, cpu_threads_bind=str(core),
        )  # fmt: skip
        proc = start_engine("vllm", cfg, install=install, timeout_s=max(timeout_s, START_TIMEOUT_S))
        return EngineComponent(cfg.url, proc)

    return start


def prepare_real_engine(pool_doc: dict[str, Any], state: Path, *, say: Callable[[str], None]) -> StartEngine:
    """Install the engine if missing, build the tiny model, swap unreachable adapter sources for
    tiny-model adapters in ``pool_doc``; return how to start one engine per engine pod."""
    install = find_engine()
    if install is None:
        say("Installing vLLM's CPU build (first run only: a few minutes, cached in ~/.cache/lorapool/engine)")
        install = install_engine(log=say)
    model = ensure_tiny_model(engine=install)
    base = str(pool_doc["spec"]["baseModel"]["name"])
    say(stand_in_note(base))
    for name, source, rank in tiny_sources(pool_doc, state / "adapters-src-tiny"):
        say(f"Serving a local tiny-model adapter for {name} (rank {rank}) instead of {source}")
    return engine_starter(model, install)
