"""Start ``vllm serve`` (CPU) or ``lorapool sim`` from ONE config, with the same flags.

Used by the conformance table (``tests/conformance``), the real-engine tests, ``lorapool engine
serve`` and whoever puts real vLLM replicas behind the router or the playground. The argv and
env builders are pure; ``start_engine`` is the thin shell (``lorapool_dev.testing.processes``).

    from lorapool_dev.engine.server import ServeConfig, start_engine
    from lorapool_dev.engine.tinymodel import ensure_tiny_model

    cfg = ServeConfig(model=str(ensure_tiny_model()), port=free_port(), max_loras=2)
    proc = start_engine("vllm", cfg)             # or "sim": same flags, same port semantics
    try:
        ...  # http://127.0.0.1:{cfg.port}/v1/...; crash_engine(proc) kills it as an OOM would
    finally:
        stop_engine(proc)                        # SIGTERM, then SIGKILL what is left of its tree
        proc.close()

(tests use ``lorapool_dev.engine.fixtures.started``, which does exactly this). A vLLM CPU server
with the tiny model takes ~35-65 s to start on 2 cores, depending on load (two at once: ~50 s)
and adds ~2.7 GB to the machine's used memory (3.9 GB summed RSS of its API server, engine core
and worker, shared pages counted twice; ``VLLM_CPU_KVCACHE_SPACE=1``): one or two at a time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from lorapool.api.vllm_versions import CPU_TIER, release_of
from lorapool_dev.engine.install import CPU_ENV, EngineInstall, require_engine
from lorapool_dev.testing.processes import RunningProcess, descendants, start_process

EngineKind = Literal["vllm", "sim"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("vllm", "sim")
VLLM_START_TIMEOUT_S = 240.0  # ~50 s on the 2-core machine; below pytest's 300 s so a stuck start reports its output
SIM_START_TIMEOUT_S = 30.0

# Environment of every vllm serve we start: CPU platform, small KV cache, runtime LoRA API,
# never reach for a hub or phone home.
VLLM_ENV: Mapping[str, str] = {
    **CPU_ENV,
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default (4+) only costs memory here
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class ServeConfig:
    """Flags both engines understand, named as ``vllm serve``'s. ``model`` is the model directory."""

    model: str
    port: int
    served_model_name: str = "tiny-llama"
    host: str = "127.0.0.1"
    enable_lora: bool = True
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    max_model_len: int = 512
    max_num_seqs: int | None = None
    # KV cache block size in tokens; None: each engine's default (the simulator's is the GPU's 16,
    # vLLM's CPU build's 128), so a test of the prefix cache sets it for both
    block_size: int | None = None
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, path) loaded at start
    seed: int = 0
    runtime_lora_updating: bool = True  # VLLM_ALLOW_RUNTIME_LORA_UPDATING
    # VLLM_CPU_OMP_THREADS_BIND for vllm: None = vLLM's "auto", which on 2 cores pins every
    # server's compute threads to core 0 (core 1 reserved); give two replicas "0" and "1".
    cpu_threads_bind: str | None = None
    # The vLLM release: the sim takes it on (--vllm-version); vllm runs the installed CPU build,
    # which is api.vllm_versions.CPU_TIER's release, so it refuses any other
    vllm_version: str = CPU_TIER
    # --shutdown-timeout (vLLM 0.32+): what SIGTERM does to requests in flight; None: the default (0, abort)
    shutdown_timeout: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def common_flags(cfg: ServeConfig) -> list[str]:
    """The flags passed to both engines. Pure."""
    flags = [
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--served-model-name", cfg.served_model_name,
        "--max-model-len", str(cfg.max_model_len),
        "--seed", str(cfg.seed),
    ]  # fmt: skip
    if cfg.enable_lora:
        flags += ["--enable-lora", "--max-loras", str(cfg.max_loras), "--max-lora-rank", str(cfg.max_lora_rank)]
        if cfg.max_cpu_loras is not None:
            flags += ["--max-cpu-loras", str(cfg.max_cpu_loras)]
    if cfg.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.block_size is not None:
        flags += ["--block-size", str(cfg.block_size)]
    if cfg.lora_modules:
        flags += ["--lora-modules", *(f"{name}={path}" for name, path in cfg.lora_modules)]
    if cfg.shutdown_timeout is not None:
        flags += ["--shutdown-timeout", str(cfg.shutdown_timeout)]
    return flags


def vllm_argv(cfg: ServeConfig, install: EngineInstall) -> list[str]:
    """``vllm serve MODEL <flags>`` from the engine venv. Pure."""
    return [str(install.vllm), "serve", cfg.model, *common_flags(cfg)]


def vllm_env(cfg: ServeConfig) -> dict[str, str]:
    """Environment added to the caller's for ``vllm serve``. Pure."""
    env = dict(VLLM_ENV)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "true" if cfg.runtime_lora_updating else "false"
    if cfg.cpu_threads_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_threads_bind
    return env


def sim_argv(cfg: ServeConfig, *, python: str = sys.executable, extra: Sequence[str] = ()) -> list[str]:
    """``lorapool sim --model MODEL <same flags>``; ``extra`` adds simulator-only flags. Pure."""
    version = ["--vllm-version", cfg.vllm_version]
    return [python, "-m", "lorapool.cli", "sim", "--model", cfg.model, *common_flags(cfg), *version, *extra]


def sim_env(cfg: ServeConfig) -> dict[str, str]:
    return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true" if cfg.runtime_lora_updating else "false"}


def engine_command(
    kind: EngineKind, cfg: ServeConfig, *, install: EngineInstall | None = None, sim_extra: Sequence[str] = ()
) -> tuple[list[str], dict[str, str], float]:
    """argv, added env and start timeout for ``kind``; vllm needs the installed engine."""
    if kind == "vllm":
        if release_of(cfg.vllm_version) != release_of(CPU_TIER):
            raise ValueError(f"vllm_version {cfg.vllm_version!r}: the CPU engine is vLLM {CPU_TIER}; use the sim")
        return vllm_argv(cfg, install or require_engine()), vllm_env(cfg), VLLM_START_TIMEOUT_S
    if kind == "sim":
        return sim_argv(cfg, extra=sim_extra), sim_env(cfg), SIM_START_TIMEOUT_S
    raise ValueError(f"engine kind {kind!r}: expected one of {', '.join(ENGINE_KINDS)}")


def start_engine(
    kind: EngineKind,
    cfg: ServeConfig,
    *,
    install: EngineInstall | None = None,
    sim_extra: Sequence[str] = (),
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> RunningProcess:
    """Start the engine and return once ``/health`` answers 200; ProcessError (with its output) if not.

    ``env`` is added last (e.g. ``lora_cache.INSPECT_ENV``). The result is a context manager that
    stops the process (SIGTERM, then SIGKILL).
    """
    argv, base_env, default_timeout = engine_command(kind, cfg, install=install, sim_extra=sim_extra)
    return start_process(argv, f"{cfg.url}/health", timeout_s or default_timeout, env={**base_env, **(env or {})})


def stop_engine(proc: RunningProcess, timeout_s: float = 30.0) -> int:
    """Stop the engine (SIGTERM: vLLM stops its engine core and worker), then SIGKILL whatever
    of its process tree is still alive, so nothing outlives the caller. Returns the exit code."""
    tree = descendants(proc.pid)
    code = proc.stop(timeout_s)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return code


def crash_engine(proc: RunningProcess) -> None:
    """SIGKILL the engine and every process it started, as an OOM kill of its container would.

    vLLM's engine core and worker outlive a SIGKILLed API server (measured: still alive 20 s
    later, reparented away from the test), holding memory and cores; a test that simulates an
    engine crash must kill the whole tree. ``proc.stop()`` (SIGTERM) lets vLLM stop its children.
    """
    tree = [proc.pid, *descendants(proc.pid)]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.popen.wait()
