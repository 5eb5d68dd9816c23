"""Parse ``vllm serve`` argument lists with vLLM's own parser; run by a parser venv's python, by path.

Not imported by lorapool: ``lorapool_dev.engine.parsers`` runs ``<venv>/bin/python parse_flags.py`` with
one JSON document on stdin, ``{"module": <where make_arg_parser lives>, "argvs": [[model, flag,
...], ...]}``, and reads one JSON list on stdout, one entry per argv: ``{"lora": {...}}`` with what
the parser made of the LoRA and serving flags, after vLLM's own ``LoRAConfig`` checked them (rank
among vLLM's sizes, ``max_cpu_loras >= max_loras``), or ``{"error": "..."}`` with vLLM's message.
Only the standard library and vllm are imported: the venv has no lorapool.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
from typing import Any

FIELDS = (
    "model_tag", "served_model_name", "host", "port", "dtype", "max_model_len", "gpu_memory_utilization",
    "tensor_parallel_size", "max_num_seqs", "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "lora_dtype",
    "lora_target_modules", "enable_prefix_caching",
)  # fmt: skip


def parse_one(parser: Any, lora_config: Any, argv: list[str]) -> dict[str, Any]:
    """One argv through the parser and LoRAConfig; argparse's exit becomes an error entry."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines()
        return {"error": lines[-1] if lines else "argparse exited"}
    if args.enable_lora:
        try:
            lora_config(
                max_loras=args.max_loras,
                max_lora_rank=args.max_lora_rank,
                max_cpu_loras=args.max_cpu_loras,
                lora_dtype=args.lora_dtype,
            )
        except Exception as exc:  # vLLM raises ValueError or pydantic's ValidationError
            return {"error": f"LoRAConfig: {exc}"}
    return {"lora": {name: _plain(getattr(args, name, None)) for name in FIELDS}}


def _plain(value: Any) -> Any:
    """JSON for a parsed value: scalars and lists as they are, anything else as its str."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def main() -> int:
    request = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):  # vLLM logs on import; stdout carries only the answer
        cli_args = importlib.import_module(request["module"])
        from vllm.config.lora import LoRAConfig
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        results = [parse_one(parser, LoRAConfig, list(argv)) for argv in request["argvs"]]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
