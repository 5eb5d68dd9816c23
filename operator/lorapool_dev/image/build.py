"""Build the Dockerfile's `runtime` and `sim` targets with buildah, without Docker or a registry.

Called by ``lorapool image build`` and the images tests. The shell around recipe.py (pure):
it installs the Debian packages it needs when they are missing (``install_tools``), makes the
base image once with debootstrap, the wheelhouse once with the host's pip, builds each target
with ``buildah build`` from a copy of exactly the files .dockerignore admits, and writes it as
an OCI archive. Everything lives in ``$LORAPOOL_CACHE/images/`` (default
``~/.cache/lorapool/images``), buildah's storage included (its own ``--root``: nothing touches
the machine's /var/lib/containers), keyed by content; a warm run hashes the context and finds
the archives. An exclusive lock serialises concurrent builds.

Why a wheelhouse: pip inside a build container does not trust this machine's certificate chain
(and CI's containers may reach no index); wheels made on the host install offline, through the
Dockerfile's optional WHEELHOUSE input, which a plain ``docker build`` leaves empty.

Measured on the 2-core machine: see CONTRIBUTING.md ("Images").
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import lorapool
from lorapool.cache import cache_root, exclusive
from lorapool_dev.image.recipe import BaseSpec, BuildPlan, Image, buildah_build_argv, context_files, plan_build
from lorapool_dev.image.recipe import wheelhouse_requirements as requirements_of

Log = Callable[[str], None]

# Command -> the Debian package that provides it; installed with apt-get when missing.
TOOLS: Mapping[str, str] = {
    "buildah": "buildah",
    "debootstrap": "debootstrap",
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
}
STAMP = "BUILT.json"


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message names the step and what to do."""


def log(message: str) -> None:
    """Progress on stderr: stdout carries only the `<target> <reference> <archive>` lines."""
    print(f"[lorapool image] {message}", file=sys.stderr, flush=True)


def images_root(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "images"


def repo_root() -> Path:
    """The source tree holding the Dockerfile (this package runs from it, editable install)."""
    root = Path(lorapool.__file__).resolve().parents[2]
    if not (root / "Dockerfile").is_file():
        raise ImageBuildError(f"no Dockerfile in {root}: run lorapool image build from a source checkout")
    return root


def install_tools(say: Log = log) -> list[str]:
    """apt-get install the packages of TOOLS whose command is missing; return what was installed.

    Idempotent and instant when every command is on PATH (CI's step before the images tier).
    """
    missing = sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None})
    if not missing:
        return []
    if os.geteuid() != 0:
        raise ImageBuildError(f"missing {', '.join(missing)}: run `apt-get install -y {' '.join(missing)}` as root")
    say(f"Installing Debian packages packages={','.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)
    return missing


def storage_flags(root: Path) -> list[str]:
    return ["--root", str(root / "storage"), "--runroot", str(root / "run"), "--storage-driver", "overlay"]


def read_plan(repo: Path, out_dir: Path, base: BaseSpec | None = None) -> tuple[BuildPlan, list[str]]:
    """The plan for the tree as it is now, and the context's files (repo-relative)."""
    paths = [p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts]
    files = context_files(paths, (repo / ".dockerignore").read_text())
    plan = plan_build(
        version=lorapool.__version__,
        dockerfile=(repo / "Dockerfile").read_bytes(),
        context={f: (repo / f).read_bytes() for f in files},
        base=base or BaseSpec(),
        requirements=requirements_of((repo / "pyproject.toml").read_text()),
        machine=platform.machine(),
        out_dir=out_dir,
    )
    return plan, files


def build_images(cache: Path | None = None, *, say: Log = log) -> list[Image]:
    """Build (or find) both images; return them, archives in ``$LORAPOOL_CACHE/images/oci``."""
    root = images_root(cache)
    repo = repo_root()
    plan, files = read_plan(repo, root / "oci")
    if _built(plan):
        return list(plan.images)
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / ".build.lock", say):
        if _built(plan):
            return list(plan.images)
        started = time.monotonic()
        install_tools(say)
        storage = storage_flags(root)
        base = BaseSpec()
        ensure_base(plan, base, root, storage, say)
        wheelhouse = ensure_wheelhouse(plan, repo, base, root, say)
        with tempfile.TemporaryDirectory(prefix="context-", dir=root) as tmp:
            context = Path(tmp)
            for rel in files:
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(repo / rel, context / rel)
            for image in plan.images:
                _build_one(plan, image, repo / "Dockerfile", context, wheelhouse, storage, say)
        _prune(plan, root, storage)
        seconds = time.monotonic() - started
        stamp = {
            "key": plan.key,
            "seconds": round(seconds, 1),
            "images": {
                i.target: {"reference": i.reference, "bytes": Path(i.archive).stat().st_size} for i in plan.images
            },
        }
        (root / "oci" / f"{plan.key}.{STAMP}").write_text(json.dumps(stamp, indent=2) + "\n")
        say(f"Built images key={plan.key} seconds={seconds:.0f}")
        return list(plan.images)


def images_built(cache: Path | None = None) -> bool:
    """Both archives of the current content key exist: ``build_images`` would only find them."""
    return _built(read_plan(repo_root(), images_root(cache) / "oci")[0])


def _built(plan: BuildPlan) -> bool:
    return all(Path(i.archive).is_file() for i in plan.images)


def _build_one(
    plan: BuildPlan, image: Image, dockerfile: Path, context: Path, wheelhouse: Path, storage: list[str], say: Log
) -> None:
    started = time.monotonic()
    say(f"Building target={image.target} reference={image.reference}")
    argv = buildah_build_argv(
        plan, image, dockerfile=dockerfile, context_dir=context, wheelhouse=wheelhouse, storage=storage
    )
    _run(argv)
    archive = Path(image.archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    _run(["buildah", *storage, "push", "--quiet", image.reference, f"oci-archive:{partial}:{image.reference}"])
    partial.rename(archive)
    size_mb = archive.stat().st_size / 1e6
    say(f"Built target={image.target} seconds={time.monotonic() - started:.0f} archive={archive} mb={size_mb:.0f}")


def ensure_base(plan: BuildPlan, spec: BaseSpec, root: Path, storage: list[str], say: Log) -> None:
    """The base image in buildah's storage: imported from the cached rootfs tar, made when missing."""
    found = subprocess.run(
        ["buildah", *storage, "inspect", "--type", "image", plan.base_reference], capture_output=True, check=False
    )
    if found.returncode == 0:
        return
    tar = root / f"base-{plan.base_key}.tar"
    if not tar.is_file():
        _debootstrap(spec, tar, root, say)
    say(f"Importing base image reference={plan.base_reference}")
    container = _run(["buildah", *storage, "from", "scratch"]).strip()
    try:
        mount = _run(["buildah", *storage, "mount", container]).strip()
        _run(["tar", "-xf", str(tar), "-C", mount, "--numeric-owner"])
        path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        _run(["buildah", *storage, "config", "--env", path, "--env", "LANG=C.UTF-8", "--cmd", "python3", container])
        _run(["buildah", *storage, "commit", "--quiet", container, plan.base_reference])
    finally:
        subprocess.run(["buildah", *storage, "rm", container], capture_output=True, check=False)


def _debootstrap(spec: BaseSpec, tar: Path, root: Path, say: Log) -> None:
    started = time.monotonic()
    say(f"Making the base rootfs suite={spec.suite} packages={','.join(spec.packages)} (once, ~1 min)")
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=root) as tmp:
        rootfs = Path(tmp) / "rootfs"
        include = f"--include={','.join(spec.packages)}"
        _run(["debootstrap", "--variant=minbase", include, spec.suite, str(rootfs), spec.mirror])
        for rel in spec.trimmed:
            target = rootfs / rel
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        (rootfs / "etc" / "resolv.conf").write_text("")  # the host's, copied by debootstrap
        partial = tar.with_name(tar.name + ".partial")
        _run(["tar", "-cf", str(partial), "--numeric-owner", "-C", str(rootfs), "."])
        partial.rename(tar)
    say(f"Made the base rootfs seconds={time.monotonic() - started:.0f} tar={tar}")


def ensure_wheelhouse(plan: BuildPlan, repo: Path, spec: BaseSpec, root: Path, say: Log) -> Path:
    """Wheels of the runtime dependencies and the build backend, made once by a Python of the
    base's version (binary wheels must match its ABI)."""
    directory = root / f"wheelhouse-{plan.wheelhouse_key}"
    if (directory / STAMP).is_file():
        return directory
    python = _python(spec.python)
    requirements = requirements_of((repo / "pyproject.toml").read_text())
    say(f"Making the wheelhouse python={python} requirements={len(requirements)}")
    shutil.rmtree(directory, ignore_errors=True)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    _run([python, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(partial), *requirements])
    (partial / STAMP).write_text(json.dumps({"requirements": requirements}, indent=2) + "\n")
    partial.rename(directory)
    return directory


def _python(version: str) -> str:
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found is None:
        raise ImageBuildError(f"the base image runs Python {version}; its wheels need a python{version} on PATH")
    return found


def _prune(plan: BuildPlan, root: Path, storage: list[str]) -> None:
    """Keep one build: older archives and the built images go (buildah's storage keeps the base)."""
    keep = {Path(i.archive).name for i in plan.images} | {f"{plan.key}.{STAMP}"}
    for old in (root / "oci").iterdir():
        if old.name not in keep:
            old.unlink()
    for image in plan.images:
        subprocess.run(["buildah", *storage, "rmi", image.reference], capture_output=True, check=False)
    subprocess.run(["buildah", *storage, "rmi", "--prune"], capture_output=True, check=False)


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        raise ImageBuildError(f"`{' '.join(argv[:4])} ...` failed (exit {result.returncode}):\n{tail}")
    return result.stdout


def _lock(path: Path, say: Log) -> contextlib.AbstractContextManager[None]:
    return exclusive(path, lambda holder: say(f"Waiting for another image build lock={path} holder={holder}"))
