"""`lorapool adapter`: the home of commands about one adapter.

* ``push DIR oci://REGISTRY[:PORT]/REPOSITORY:TAG``: verify a PEFT directory offline, package it as
  an ORAS-style artifact (``lorapool.sources.oci_push``) and push it; stdout carries only the
  manifest digest (``sha256:<64 hex>``) so CI can capture it and pin a LoRAAdapter by it.
* ``pull oci://... DIR``: fetch an adapter as the sidecar does (every blob digest-checked, traversal
  refused) into DIR, then verify it; stdout carries the digest it resolved to.

Credentials: ``--username`` with ``--password-stdin``, else the docker config (``$DOCKER_CONFIG/
config.json``, else ``~/.docker/config.json``) as ``docker login`` writes it. Progress and the
verification's verdict go to stderr; no credential is ever printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from lorapool.errors import LoRAPoolError

DIGEST_HELP = "prints the manifest digest (sha256:<64 hex>) alone on stdout"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="adapter_command", metavar="ACTION", required=True)
    push = sub.add_parser("push", help=f"verify and push a PEFT directory to an OCI registry; {DIGEST_HELP}")
    push.add_argument("directory", type=Path, help="the PEFT adapter directory (adapter_config.json, weights)")
    push.add_argument("reference", help="oci://REGISTRY[:PORT]/REPOSITORY:TAG")
    push.add_argument("--base-config", type=Path, help="the base model's config.json, to verify shapes against")
    push.add_argument("--base-model", help="the base model's name, to verify against the planner's dimensions for it")
    pull = sub.add_parser("pull", help=f"fetch an adapter from an OCI registry into a directory; {DIGEST_HELP}")
    pull.add_argument("reference", help="oci://REGISTRY[:PORT]/REPOSITORY(:TAG|@sha256:DIGEST)")
    pull.add_argument("directory", type=Path, help="an empty or missing directory to write the adapter into")
    for p in (push, pull):
        p.add_argument("--plain-http", action="store_true", help="talk HTTP, not HTTPS, to the registry")
        p.add_argument("--ca-file", type=Path, help="PEM bundle the registry's certificate is checked against")
        p.add_argument("--username", help="registry login; the password is read from stdin (--password-stdin)")
        p.add_argument("--password-stdin", action="store_true", help="read the registry password from stdin")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _login(args: argparse.Namespace, registry: str) -> Any:
    from lorapool.errors import SourceError
    from lorapool.sources.oci_client import Login, login_for, parse_docker_config

    if args.password_stdin or args.username:
        if not (args.password_stdin and args.username):
            raise SourceError("--username and --password-stdin go together; give both", transient=False)
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise SourceError("--password-stdin: stdin held no password; pipe it in", transient=False)
        return Login(args.username, password)
    directory = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    return login_for(parse_docker_config(path.read_text(), where=str(path)), registry)


def _base_shape(args: argparse.Namespace, config: dict[str, Any]) -> tuple[Any, str]:
    """The shape to verify against and how it was found: --base-config, else the planner's dimensions
    for --base-model (or the adapter's base_model_name_or_path), else none (config and weights only)."""
    from lorapool.plan.dims import lookup_model
    from lorapool.sources.verify import BaseShape

    if args.base_config is not None:
        try:
            doc = json.loads(args.base_config.read_text())
        except (OSError, ValueError) as exc:
            raise LoRAPoolError(f"--base-config {args.base_config}: not a readable JSON config.json ({exc})") from None
        return BaseShape.from_config(doc, name=str(args.base_config)), f"against --base-config {args.base_config}"
    name = args.base_model or config.get("base_model_name_or_path")
    dims = lookup_model(name) if isinstance(name, str) else None
    if dims is not None:
        return BaseShape.from_dims(dims), f"against the planner's dimensions of {dims.key} (for {name!r})"
    why = f"no known dimensions for {name!r}" if name else "no base model named"
    return None, f"config and weights only ({why}; give --base-config to check shapes)"


def _push(args: argparse.Namespace) -> int:
    from lorapool.errors import SourceError
    from lorapool.sources.layout import find_adapter_root, parse_config_bytes, pick_files
    from lorapool.sources.oci_client import Reference
    from lorapool.sources.oci_push import push_adapter
    from lorapool.sources.verify import verify_adapter_dir

    ref = Reference.parse(args.reference)
    if ref.tag is None or ref.digest is not None:
        raise SourceError(f"{args.reference}: push needs a tag and no digest (oci://.../repo:v1)", transient=False)
    if not args.directory.is_dir():
        raise LoRAPoolError(f"{args.directory}: not a directory; give the PEFT adapter's directory")
    root = find_adapter_root(args.directory, where=str(args.directory))
    files = pick_files(root, where=str(root))
    config = parse_config_bytes(files["adapter_config.json"].read_bytes(), where=str(root))
    base, how = _base_shape(args, config)
    _say(f"Verifying {root} {how}")
    _say(verify_adapter_dir(root, base, where=str(root)).describe())
    login = _login(args, ref.registry)
    digest = asyncio.run(push_adapter(files, ref, login=login, plain_http=args.plain_http, ca_file=args.ca_file))
    _say(f"Pushed {ref} ({len(files)} files)")
    print(digest)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from lorapool.sources.base import Limits
    from lorapool.sources.layout import find_adapter_root, pick_files
    from lorapool.sources.oci import OciSource
    from lorapool.sources.oci_client import Reference
    from lorapool.sources.verify import verify_adapter_dir

    target: Path = args.directory
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise LoRAPoolError(f"{target}: exists and is not an empty directory; give a new one")
    registry = Reference.parse(args.reference).registry
    plain = frozenset({registry}) if args.plain_http else frozenset()
    source = OciSource(args.reference, None, login=_login(args, registry), plain_http=plain, ca_file=args.ca_file)
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=target) as tmp:
        downloaded = asyncio.run(source.download(Path(tmp), limits=Limits()))
        root = find_adapter_root(downloaded.root, where=args.reference)
        files = pick_files(root, where=args.reference)
        _say(verify_adapter_dir(root, None, where=args.reference).describe())
        for name, path in files.items():
            path.rename(target / name)
    _say(f"Pulled {args.reference} into {target} ({downloaded.bytes} bytes)")
    print(downloaded.resolved_revision)
    return 0


def run(args: argparse.Namespace) -> int:
    from lorapool.commands.common import fail

    try:
        return _push(args) if args.adapter_command == "push" else _pull(args)
    except LoRAPoolError as exc:
        return fail(exc, f"adapter {args.adapter_command}")
