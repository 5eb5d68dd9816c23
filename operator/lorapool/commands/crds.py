"""`lorapool crds [--out DIR]`: write the CRDs generated from the API models."""

from __future__ import annotations

import argparse
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("crds"), help="directory to write into (default: crds)")
    parser.add_argument("--stdout", action="store_true", help="print instead of writing files")


def run(args: argparse.Namespace) -> int:
    from lorapool.api.crd import crds
    from lorapool.api.yamlio import dump

    generated = crds()
    if args.stdout:
        print("---\n".join(dump(crd) for crd in generated.values()), end="")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, crd in generated.items():
        (args.out / name).write_text(dump(crd))
        print(f"wrote {args.out / name}")
    return 0
