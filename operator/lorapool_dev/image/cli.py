"""``lorapool image``: the project's images from its Dockerfile, without Docker.

lorapool image build [--out DIR]   # runtime and sim targets as OCI archives; cached by content

Prints one line per image, ``<target> <reference> <archive path>``; progress goes to stderr.
A cold build makes the base rootfs and the wheelhouse first (see CONTRIBUTING.md, "Images").
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lorapool_dev.image.build import ImageBuildError, build_images
from lorapool_dev.image.recipe import Image


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="build the runtime and sim targets of the Dockerfile as OCI archives")
    build.add_argument(
        "--out", type=Path, default=None, help="also place the archives here (default: only the cache's)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        images = build_images()
    except ImageBuildError as exc:
        print(f"lorapool image: {exc}", file=sys.stderr)
        return 1
    for image in images:
        print((_place(image, args.out) if args.out else image).line())
    return 0


def _place(image: Image, out: Path) -> Image:
    """The archive under ``out`` as ``lorapool-<target>-<version>.oci.tar`` (a hard link when it can)."""
    out.mkdir(parents=True, exist_ok=True)
    version = image.reference.rsplit(":", 1)[1]
    target = out / f"lorapool-{image.target}-{version}.oci.tar"
    target.unlink(missing_ok=True)
    try:
        os.link(image.archive, target)
    except OSError:
        import shutil

        shutil.copyfile(image.archive, target)
    return Image(image.target, image.reference, target.resolve())
