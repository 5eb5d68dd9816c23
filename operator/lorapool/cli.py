"""The `lorapool` command: one entry point for every component.

Each subcommand lives in its own module, which exposes
``configure(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``. Modules are imported lazily so that
`lorapool plan` never pays for importing kopf or aiohttp.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("lorapool.commands.plan", "derive vLLM LoRA flags and the GPU memory budget"),
    "render": ("lorapool.commands.render", "print every object the operator applies for a pool"),
    "crds": ("lorapool.commands.crds", "write the CustomResourceDefinitions generated from the API"),
    "operator": ("lorapool.controller.cli", "run the Kubernetes operator (kopf)"),
    "sim": ("lorapool.sim.cli", "run the vLLM simulator (a GPU-free stand-in for vllm serve)"),
    "sidecar": ("lorapool.sidecar.cli", "run the adapter-sync sidecar next to a vLLM engine"),
    "router": ("lorapool.router.cli", "run the adapter-aware OpenAI router"),
    "cluster": ("lorapool.cluster.cli", "build and run a local Kubernetes control plane"),
    "dev": ("lorapool.dev", "start the local playground: control plane, operator, example pool"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorapool",
        description="Serve many LoRA adapters on shared vLLM base-model replicas.",
    )
    from lorapool import __version__

    parser.add_argument("--version", action="version", version=f"lorapool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        command_parser.set_defaults(_module=module_name)
        # Configuring needs the module; a module that fails to import only breaks its own command.
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            command_parser.set_defaults(_import_error=exc)
            continue
        module.configure(command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if error := getattr(args, "_import_error", None):
        print(f"lorapool {args.command}: unavailable: {error}", file=sys.stderr)
        return 1
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
