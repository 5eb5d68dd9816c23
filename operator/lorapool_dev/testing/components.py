"""Start lorapool's own components as real processes: one command line each.

The playground (``lorapool dev``), the benchmark and the process tests all run ``lorapool sim``,
``lorapool sidecar``, ``lorapool router`` and ``lorapool operator`` the way a user would, over loopback. Their flags are
built here and nowhere else, so a renamed flag breaks one function, not five call sites.

    with start_sim(max_loras=2, lora_modules={"sql": path}) as sim, start_router([sim.url]) as router:
        openai.OpenAI(base_url=f"{router.url}/v1", api_key="x").completions.create(model="sql", ...)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from types import TracebackType
from typing import Any

from lorapool_dev.testing.processes import RunningProcess, free_port, start_process

LORAPOOL = (sys.executable, "-m", "lorapool.cli")
# vLLM refuses /v1/load_lora_adapter without it; the simulator follows vLLM.
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}


@dataclass
class Component:
    """A running component: its base URL and its process (stopped on ``close`` or ``with`` exit)."""

    url: str
    proc: RunningProcess

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def close(self) -> None:
        self.proc.close()

    def __enter__(self) -> Component:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def sim_argv(
    port: int,
    *,
    served_model_name: str | None = None,
    enable_lora: bool = True,
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
    max_cpu_loras: int | None = None,
    max_num_seqs: int | None = None,
    time_scale: float | None = None,
    seed: int | None = None,
    log_level: str | None = None,
    lora_modules: Mapping[str, str | PathLike[str]] | None = None,
    vllm_version: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """``lorapool sim`` with vLLM's flag names; ``None`` leaves a flag at the simulator's default."""
    argv = [*LORAPOOL, "sim", "--port", str(port)]
    argv += _opt("--served-model-name", served_model_name)
    argv += ["--enable-lora"] if enable_lora else []
    argv += _opt("--max-loras", max_loras) + _opt("--max-lora-rank", max_lora_rank)
    argv += _opt("--max-cpu-loras", max_cpu_loras) + _opt("--max-num-seqs", max_num_seqs)
    argv += _opt("--time-scale", None if time_scale is None else f"{time_scale:g}")
    argv += _opt("--seed", seed) + _opt("--log-level", log_level) + _opt("--vllm-version", vllm_version)
    if lora_modules:
        argv += ["--lora-modules", *(f"{name}={path}" for name, path in lora_modules.items())]
    return [*argv, *extra]


def sidecar_argv(
    status_port: int,
    *,
    config: str | PathLike[str] | None,
    engine_url: str,
    adapter_dir: str | PathLike[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """``lorapool sidecar`` reading ``config`` (adapters.json; None: ``extra`` names the ConfigMap to
    read through the API, ``--adapters-configmap``) and loading into ``engine_url``."""
    return [
        *LORAPOOL, "sidecar", *(["--config", str(config)] if config is not None else []), "--engine", engine_url,
        "--adapter-dir", str(adapter_dir), "--status-port", str(status_port), *extra,
    ]  # fmt: skip


def router_argv(
    port: int, backends: Sequence[str], *, policy: str | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """``lorapool router`` in front of a static list of backend URLs."""
    argv = [*LORAPOOL, "router", "--port", str(port), *_opt("--policy", policy)]
    for backend in backends:
        argv += ["--backend", backend]
    return [*argv, *extra]


def operator_argv(
    *, kubeconfig: str | PathLike[str], metrics_port: int, liveness_port: int, extra: Sequence[str] = ()
) -> list[str]:
    """``lorapool operator`` on loopback, electing its leader in lorapool-system as the chart does."""
    return [
        *LORAPOOL, "operator", "--kubeconfig", str(kubeconfig), "--bind", "127.0.0.1",
        "--metrics-port", str(metrics_port), "--liveness-port", str(liveness_port),
        "--leader-election-namespace", "lorapool-system", *extra,
    ]  # fmt: skip


def start_sim(
    *, port: int | None = None, env: Mapping[str, str] | None = None, timeout_s: float = 60.0, **flags: Any
) -> Component:
    """Start ``lorapool sim`` (flags as ``sim_argv``'s) with runtime LoRA updating on unless ``env`` says otherwise."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    argv = sim_argv(port, **flags)
    return Component(url, start_process(argv, f"{url}/health", timeout_s, env={**RUNTIME_LORA_ENV, **(env or {})}))


def start_sidecar(
    *,
    config: str | PathLike[str] | None,
    engine_url: str,
    adapter_dir: str | PathLike[str],
    extra: Sequence[str] = (),
    timeout_s: float = 30.0,
) -> Component:
    """Start ``lorapool sidecar``; its URL serves /status, /metrics and /healthz."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = sidecar_argv(port, config=config, engine_url=engine_url, adapter_dir=adapter_dir, extra=extra)
    return Component(url, start_process(argv, f"{url}/healthz", timeout_s))


def start_router(
    backends: Sequence[str],
    *,
    policy: str | None = None,
    extra: Sequence[str] = (),
    health_path: str = "/livez",
    timeout_s: float = 60.0,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Component:
    """Start ``lorapool router``; returns once ``health_path`` answers (``/health`` also needs a live backend).
    ``env``: added to the environment (``KUBECONFIG`` for ``--report-pods``)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    argv = router_argv(port, backends, policy=policy, extra=extra)
    return Component(url, start_process(argv, url + health_path, timeout_s, env=env))


def _opt(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]
