"""The `lorapool` command: one entry point for every component.

Each subcommand lives in its own module, which exposes
``configure(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``. Modules are imported lazily so that
`lorapool plan` never pays for importing kopf or aiohttp. ``cluster``, ``engine``, ``image`` and
``dev`` are dev tooling: they live in the ``lorapool_dev`` package beside ``lorapool`` (a source
checkout's ``pip install -e '.[test]'`` installs both; the image carries ``lorapool`` alone), and
``cluster`` and ``dev`` need the ``test`` extra's packages (e.g. ``cryptography``). Without either
they say what to install.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand: its module, its one-line help and the extra it needs beyond the runtime."""

    module: str
    help: str
    # The optional-dependency group the command needs (its module imports packages that the
    # image and a plain `pip install lorapool` do not carry); None: runtime dependencies only.
    extra: str | None = None


COMMANDS: dict[str, Command] = {
    "plan": Command("lorapool.commands.plan", "derive vLLM LoRA flags and the GPU memory budget"),
    "render": Command("lorapool.commands.render", "print every object the operator applies for a pool"),
    "crds": Command("lorapool.commands.crds", "write the CustomResourceDefinitions generated from the API"),
    "adapter": Command("lorapool.commands.adapter", "push an adapter to an OCI registry (verified), or pull one"),
    "operator": Command("lorapool.controller.cli", "run the Kubernetes operator (kopf)"),
    "sim": Command("lorapool.sim.cli", "run the vLLM simulator (a GPU-free stand-in for vllm serve)"),
    "sidecar": Command("lorapool.sidecar.cli", "run the adapter-sync sidecar next to a vLLM engine"),
    "router": Command("lorapool.router.cli", "run the adapter-aware OpenAI router"),
    "cluster": Command("lorapool_dev.cluster.cli", "build and run a local Kubernetes control plane", extra="test"),
    "engine": Command("lorapool_dev.engine.cli", "install and run the real engine (vLLM CPU) with a tiny local model"),
    "image": Command("lorapool_dev.image.cli", "build the runtime and sim images from the Dockerfile without Docker"),
    "dev": Command(
        "lorapool_dev.dev.playground", "start the local playground: control plane, operator, example pool", extra="test"
    ),
}

DEV_PACKAGE = "lorapool_dev"


def extra_modules(extra: str) -> frozenset[str] | None:
    """Top-level module names of the extra's packages, from the installed metadata (None when
    lorapool runs from a source tree without metadata)."""
    from importlib import metadata

    try:
        requirements = metadata.requires("lorapool") or []
    except metadata.PackageNotFoundError:
        return None
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    names = (re.match(r"[A-Za-z0-9._-]+", r) for r in requirements if marker.search(r))
    return frozenset(m.group(0).lower().replace("-", "_").replace(".", "_") for m in names if m)


def missing_extra(name: str, exc: ImportError) -> str | None:
    """The message for a dev-only command whose package or extra is missing, else None."""
    extra = COMMANDS[name].extra
    missing = exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
    if missing == DEV_PACKAGE and COMMANDS[name].module.startswith(f"{DEV_PACKAGE}."):
        return (
            f"error: lorapool {name} is development tooling (the {DEV_PACKAGE} package), which this install does"
            " not carry (the image leaves it out): from a source checkout, pip install -e '.[test]'"
        )
    if extra is None or missing is None:
        return None
    modules = extra_modules(extra)
    if modules is not None and missing.lower() not in modules:
        return None
    return (
        f"error: lorapool {name} needs the {extra} extra: pip install 'lorapool[{extra}]' ({missing} is not installed)"
    )


def build_parser(configured: Iterable[str] = ()) -> argparse.ArgumentParser:
    """Every subcommand is listed; only those in ``configured`` import their module and add
    their flags, so `lorapool router` never imports the dev tooling behind `cluster` or `dev`."""
    parser = argparse.ArgumentParser(
        prog="lorapool",
        description="Serve many LoRA adapters on shared vLLM base-model replicas.",
    )
    from lorapool import __version__

    parser.add_argument("--version", action="version", version=f"lorapool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = set(configured)
    for name, command in COMMANDS.items():
        command_parser = sub.add_parser(name, help=command.help, description=command.help)
        command_parser.set_defaults(_module=command.module)
        if name not in wanted:
            continue
        # Configuring needs the module (main has checked that it imports).
        importlib.import_module(command.module).configure(command_parser)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (the first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def import_error(name: str) -> ImportError | None:
    """Why the command's module cannot be imported (a dev command without lorapool_dev or its
    extra), else None."""
    try:
        importlib.import_module(COMMANDS[name].module)
    except ImportError as exc:
        return exc
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    name = chosen_command(argv)
    if name in COMMANDS and (error := import_error(name)):
        # Before parsing: the command's own flags (even --help) need its module.
        print(missing_extra(name, error) or f"lorapool {name}: unavailable: {error}", file=sys.stderr)
        return 1
    parser = build_parser([name] if name else [])
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except ModuleNotFoundError as exc:
        # Dev-only commands import their extra's packages lazily, inside run.
        if message := missing_extra(args.command, exc):
            print(message, file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
