"""vLLM's own ``vllm serve`` parser for each supported release, in venvs cached outside the repo.

Called by the flag contract (tests/render/test_vllm_parser.py) and ``lorapool engine parsers``
(``scripts/ci.py`` installs them beside the engine). One venv per release in
``$LORAPOOL_CACHE/parsers/vllm-<version>/``, installed once (stamp, lock: as ``engine.install``):

1. ``python -m venv``; ``pip install --no-deps vllm==<version>``: the PyPI wheel, the GPU build
   the ``vllm/vllm-openai`` image runs (~240 MB download; its parser is what a pod parses with);
2. a ``.pth`` file puts the CPU engine's site-packages (``lorapool engine install``) after the
   venv's own: the parser's import needs torch, transformers, pydantic, fastapi... and the
   engine venv has them (its torch 2.13 CPU stands in for 0.34's 2.14: nothing of torch runs to
   build a parser). The venv's own ``vllm`` comes first on ``sys.path``, so it is the one imported;
3. smoke: import the release's ``make_arg_parser`` (``api.vllm_versions``: its module moved).

``VLLM_TARGET_DEVICE=cpu`` is set for every run: the GPU wheel cannot infer a device here.
Measured on the 2-core machine: a cold install ~25 s per release (download 4 s at ~70 MB/s,
install 14 s, smoke 10 s), 1.1 GB each; parsing a batch of argvs ~13 s (most of it ``import
vllm``), so the contract parses all its pools in one run per release.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapool.api.vllm_versions import SUPPORTED, VllmRelease
from lorapool.cache import cache_root, exclusive
from lorapool_dev.engine.install import CPU_ENV, EngineInstall, EngineInstallError, require_engine, site_packages

STAMP = "INSTALLED.json"
PARSE_SCRIPT = Path(__file__).with_name("parse_flags.py")
PARSE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ParserVenv:
    """An installed parser venv of one release."""

    root: Path
    release: VllmRelease

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def parser_root(version: str, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "parsers" / f"vllm-{version}"


def find_parser(version: str, cache: Path | None = None) -> ParserVenv | None:
    """The installed parser venv of ``version``, or None (never installed, or interrupted)."""
    root = parser_root(version, cache)
    if (root / STAMP).is_file() and (root / "bin" / "python").exists():
        return ParserVenv(root, SUPPORTED[version])
    return None


def install_parser(version: str, cache: Path | None = None, *, engine: EngineInstall | None = None) -> ParserVenv:
    """Install ``version``'s parser venv unless its stamp exists. Raises EngineInstallError."""
    if version not in SUPPORTED:
        raise EngineInstallError(f"vllm {version}: not a supported release; supported: {', '.join(SUPPORTED)}")
    if (found := find_parser(version, cache)) is not None:
        return found
    deps = site_packages(engine or require_engine(cache=cache))
    root = parser_root(version, cache)
    root.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(root.parent / f".{root.name}.lock", lambda holder: _log(f"Waiting for {holder}")):
        if (found := find_parser(version, cache)) is not None:
            return found
        started = time.monotonic()
        if root.exists():
            shutil.rmtree(root)
        _log(f"Installing vLLM parser version={version} path={root}")
        _run([sys.executable, "-m", "venv", str(root)])
        venv = ParserVenv(root, SUPPORTED[version])
        pip = [str(venv.python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
        _run([*pip, "install", "--no-deps", f"vllm=={version}"])
        own = sorted((root / "lib").glob("python3*/site-packages"))[0]
        (own / "zz-lorapool-engine-deps.pth").write_text(f"{deps}\n")
        parse_argvs(venv, [])  # the smoke: vLLM's parser builds
        seconds = time.monotonic() - started
        stamp = {"version": version, "deps": str(deps), "install_seconds": round(seconds, 1)}
        (root / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        _log(f"Installed vLLM parser version={version} seconds={seconds:.0f}")
        return venv


def parse_argvs(venv: ParserVenv, argvs: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """Each argv (``vllm serve``'s arguments, model first) as the release's parser reads it:
    ``{"lora": {...}}`` or ``{"error": vLLM's message}`` (``parse_flags``)."""
    request = json.dumps({"module": venv.release.cli_module, "argvs": [list(a) for a in argvs]})
    result = subprocess.run(
        [str(venv.python), str(PARSE_SCRIPT)],
        input=request,
        env={**os.environ, **CPU_ENV},
        capture_output=True,
        text=True,
        timeout=PARSE_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise EngineInstallError(f"vLLM {venv.release.version}'s parser did not run:\n{result.stderr[-3000:]}")
    answers: list[dict[str, Any]] = json.loads(result.stdout)
    return answers


def _run(cmd: Sequence[str]) -> None:
    result = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise EngineInstallError(f"`{' '.join(cmd)}` failed ({result.returncode}):\n{result.stderr[-3000:]}")


def _log(message: str) -> None:
    print(f"[lorapool engine] {message}", file=sys.stderr, flush=True)
