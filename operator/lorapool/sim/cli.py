"""``lorapool sim``: start the vLLM simulator. Flags are named as ``vllm serve``'s where vLLM has them.

``configure`` only touches argparse and the timing dataclass (cheap); ``run`` imports aiohttp
and the engine. Every field of ``TimingParams`` is also a flag (``--decode-step-s-at-1`` ...)
whose help text gives the default and its source.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapool import logs
from lorapool.api import vllm_versions
from lorapool.api.peft import VLLM_RANKS
from lorapool.sim.timing import DEFAULT_PROFILE, PROFILES, timing_fields

if TYPE_CHECKING:
    from lorapool.sim.server import LoRAModule, SimSettings
    from lorapool.sources.verify import BaseShape

log = logging.getLogger("lorapool.sim")


def configure(parser: argparse.ArgumentParser) -> None:
    """Every flag, in the groups ``--help`` shows: vLLM's own (server, LoRA, scheduler), the simulator's, timing."""
    vllm = parser.add_argument_group("vLLM flags (same names and defaults as vllm serve)")
    _server_flags(vllm)
    _lora_flags(vllm)
    _engine_flags(vllm)
    _simulator_flags(parser)
    _timing_flags(parser)


def _server_flags(vllm: argparse._ArgumentGroup) -> None:
    vllm.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    vllm.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default %(default)s)")
    vllm.add_argument(
        "--model", default=None, help="base model id shown as the base card's root (default: the profile's)"
    )
    vllm.add_argument(
        "--served-model-name", nargs="+", default=None, help="name(s) clients use for the base model (default: --model)"
    )


def _lora_flags(vllm: argparse._ArgumentGroup) -> None:
    vllm.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    vllm.add_argument(
        "--max-loras", type=int, default=1, help="GPU slots: most distinct adapters in a batch (default 1)"
    )
    vllm.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="CPU LRU cache of adapters, >= --max-loras (default: --max-loras)",
    )
    vllm.add_argument(
        "--max-lora-rank", type=int, default=16, choices=VLLM_RANKS, help="largest servable rank (default 16)"
    )
    vllm.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help='adapters loaded at start: name=path or {"name": ..., "path": ...}',
    )


def _engine_flags(vllm: argparse._ArgumentGroup) -> None:
    """Scheduler, KV cache and sampling seed."""
    vllm.add_argument(
        "--max-num-seqs", type=int, default=None, help="most sequences in a batch (default: profile, 256)"
    )
    vllm.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="token budget per step (default: profile, 2048)"
    )
    vllm.add_argument("--max-model-len", type=int, default=None, help="context length (default: profile, 8192)")
    vllm.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="share of GPU memory vLLM may use (0.9)"
    )
    vllm.add_argument("--block-size", type=int, default=16, help="KV cache block size in tokens (16)")
    vllm.add_argument(
        "--num-gpu-blocks-override", type=int, default=None, help="KV cache blocks, instead of the memory model"
    )
    vllm.add_argument(
        "--enable-prefix-caching",
        action=_EnableDisable,
        default=True,
        help="automatic prefix caching of prompt blocks, salted by adapter name and path (default on, as vLLM V1)",
    )
    vllm.add_argument(
        "--enable-prompt-tokens-details",
        action=_EnableDisable,
        default=False,
        help="report usage.prompt_tokens_details.cached_tokens (default off, as vLLM)",
    )
    vllm.add_argument("--seed", type=int, default=0, help="seed of output text and lengths (default 0)")
    vllm.add_argument(
        "--shutdown-timeout",
        type=int,
        default=0,
        help="on SIGTERM, as vLLM: 0 aborts the requests in flight (each answered, finish_reason abort);"
        " N > 0 refuses new ones and lets those in flight finish for up to N wall seconds (default 0)",
    )


class _EnableDisable(argparse.Action):
    """A vLLM switch: ``--enable-x`` on; ``--no-enable-x`` (0.32's BooleanOptionalAction) and
    ``--disable-x`` (0.34's EnableDisableAction, which still takes the former) off."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        name = option_strings[0].removeprefix("--enable-")
        self.off = (f"--no-enable-{name}", f"--disable-{name}")
        super().__init__([*option_strings, *self.off], dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.off)


def _simulator_flags(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("simulator")
    sim.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per simulated second; 0 runs steps back to back with no delay (default 1)",
    )
    sim.add_argument(
        "--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES), help="GPU and model (default %(default)s)"
    )
    sim.add_argument(
        "--vllm-version",
        default=vllm_versions.CPU_TIER,
        metavar="V",
        help="the vLLM release to behave as: "
        + ", ".join(r.family for r in vllm_versions.SUPPORTED.values())
        + " or a full version; it answers GET /version with it, reads as its metrics row and, on a release "
        "whose load_inplace flag sticks (0.32), re-reads an adapter loaded in place from disk at every step "
        "that runs it (default %(default)s, the real-engine tier's; docs/vllm.md)",
    )
    sim.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _timing_flags(parser: argparse.ArgumentParser) -> None:
    timing = parser.add_argument_group("timing model overrides (see lorapool/sim/README.md)")
    for f in timing_fields():
        help_text = f"{f.metadata['doc']} (default {f.default}; {f.metadata['source']})"
        timing.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"timing_{f.name}",
            type=int if f.type in (int, "int") else float,
            default=None,
            help=help_text.replace("%", "%%"),
        )


def parse_lora_module(spec: str) -> LoRAModule:
    """``name=path`` or vLLM's JSON form ``{"name": ..., "path": ...}``."""
    from lorapool.sim.server import LoRAModule

    if spec.lstrip().startswith("{"):
        try:
            raw = json.loads(spec)
        except ValueError as exc:
            raise ValueError(f"--lora-modules {spec!r}: invalid JSON: {exc}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("path"), str):
            raise ValueError(f'--lora-modules {spec!r}: JSON form needs string "name" and "path"')
        return LoRAModule(raw["name"], raw["path"])
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {spec!r}: expected name=path")
    return LoRAModule(name, path)


def runtime_lora_updating_allowed(environ: dict[str, str] | os._Environ[str]) -> bool:
    """vLLM's ``envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING``: "1" or "true", any case."""
    return environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> SimSettings:
    """Resolve flags and the profile into settings; ValueError says which flag is wrong."""
    from lorapool.sim.engine import EngineConfig
    from lorapool.sim.server import SimSettings
    from lorapool.sim.timing import kv_cache_tokens

    try:
        release = vllm_versions.resolve(args.vllm_version)
    except ValueError as exc:
        raise ValueError(f"--vllm-version: {exc}") from exc
    profile = PROFILES[args.profile]
    overrides = {f.name: value for f in timing_fields() if (value := getattr(args, f"timing_{f.name}")) is not None}
    timing = profile.timing.with_overrides(**overrides)
    if timing.natural_output_tokens_min < 1 or timing.natural_output_tokens_max < timing.natural_output_tokens_min:
        raise ValueError("--natural-output-tokens-min must be >= 1 and <= --natural-output-tokens-max")
    if args.time_scale < 0:
        raise ValueError(f"--time-scale={args.time_scale} must be >= 0")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization={args.gpu_memory_utilization} must be in (0, 1]")
    if args.num_gpu_blocks_override is not None:
        blocks = args.num_gpu_blocks_override
    else:
        tokens = kv_cache_tokens(
            profile,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enable_lora=args.enable_lora,
            max_loras=args.max_loras,
            max_lora_rank=args.max_lora_rank,
        )
        blocks = tokens // args.block_size
    model = args.model or profile.model
    engine = EngineConfig(
        num_gpu_blocks=blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs or profile.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens or profile.max_num_batched_tokens,
        max_model_len=args.max_model_len or profile.max_model_len,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    return SimSettings(
        host=args.host,
        port=args.port,
        model=model,
        served_model_names=tuple(args.served_model_name or [model]),
        engine=engine,
        timing=timing,
        time_scale=args.time_scale,
        seed=args.seed,
        allow_runtime_lora_updating=runtime_lora_updating_allowed(environ),
        lora_modules=tuple(parse_lora_module(spec) for spec in args.lora_modules),
        release=release,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        shutdown_timeout_s=float(args.shutdown_timeout),
        base_shape=base_shape_of(model, name=(args.served_model_name or [model])[0]),
    )


def base_shape_of(model: str, *, name: str) -> BaseShape | None:
    """The shape in ``model``'s config.json when ``--model`` is a model directory (as vLLM reads it),
    else None: a profile's model name is a label here, its adapters need not fit a real model."""
    from lorapool.errors import AdapterError
    from lorapool.sources.verify import BaseShape

    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    try:
        return BaseShape.from_config(json.loads(config.read_text()), name=name)
    except (OSError, ValueError, AdapterError) as exc:
        raise ValueError(f"--model {model}: cannot read the model's shape from config.json: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    try:
        settings = settings_from_args(args, os.environ)
    except ValueError as exc:
        print(f"lorapool sim: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(settings))


async def _serve(settings: SimSettings) -> int:
    from lorapool.sim.server import SimServer

    server = SimServer(settings)
    try:
        await server.start()
    except (ValueError, OSError) as exc:
        print(f"lorapool sim: {exc}", file=sys.stderr)
        await server.stop()
        return 1
    engine = settings.engine
    log.info(
        "Started vLLM simulator url=http://%s:%d model=%s enable_lora=%s max_loras=%d max_cpu_loras=%d "
        "max_lora_rank=%d kv_cache_tokens=%d prefix_caching=%s time_scale=%g runtime_lora_updating=%s "
        "vllm_version=%s",
        settings.host,
        server.port,
        settings.served_model_names[0],
        engine.enable_lora,
        engine.max_loras,
        engine.cpu_capacity,
        engine.max_lora_rank,
        engine.num_gpu_blocks * engine.block_size,
        engine.enable_prefix_caching,
        settings.time_scale,
        settings.allow_runtime_lora_updating,
        settings.release.version,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(server.failed.wait())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    failed.cancel()
    await (server.stop() if server.failed.is_set() else server.shutdown())
    log.info("Stopped vLLM simulator")
    return 1 if server.failed.is_set() else 0
