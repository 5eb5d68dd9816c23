"""What `lorapool image build` builds and under which key: pure, no I/O.

The one recipe is the project's Dockerfile; this module only decides its inputs and names:
which files of the tree are the build context (.dockerignore's rule), the base image that
stands in for ``python:3.11-slim-bookworm`` (a debootstrap rootfs, no registry here), the
wheelhouse the build stage installs from offline, the content key of each, and the buildah
argv per target. The shell (build.py) reads files, runs tools and caches by these keys.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

# Bump when what a key covers changes without the inputs changing (a new debootstrap option,
# another buildah flag), so every cache entry is rebuilt.
RECIPE_VERSION = 1

# The Dockerfile targets built here, in build order, and the reference each is tagged with:
# the release image under the name the chart and the operator default to
# (DEFAULT_LORAPOOL_IMAGE), the simulator image beside it.
TARGETS: Mapping[str, str] = {
    "runtime": "ghcr.io/lorapool/lorapool",
    "sim": "ghcr.io/lorapool/lorapool-sim",
}


@dataclass(frozen=True)
class BaseSpec:
    """The stand-in for the Dockerfile's PYTHON_IMAGE: Debian's own Python of the same suite.

    ``python-is-python3`` gives the ``python`` the Dockerfile runs; pip comes with
    ``python3-pip`` (``pip wheel`` in the build stage) and ``venv`` with ``python3-venv``.
    Recommends are not installed, so no compiler reaches the runtime image.
    """

    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    python: str = "3.11"  # Debian bookworm's python3; must satisfy requires-python
    packages: tuple[str, ...] = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
    # Left out of the base: apt's lists and archives, docs, man pages, locales (~120 MB).
    trimmed: tuple[str, ...] = (
        "var/lib/apt/lists",
        "var/cache/apt/archives",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/locale",
    )


@dataclass(frozen=True)
class Image:
    """One built target: where its archive goes and what it is called."""

    target: str
    reference: str
    archive: PurePath

    def line(self) -> str:
        """What `lorapool image build` prints for it."""
        return f"{self.target} {self.reference} {self.archive}"


@dataclass(frozen=True)
class BuildPlan:
    """Everything one build needs, keyed by content: same key, same images, nothing to do."""

    key: str
    base_key: str
    wheelhouse_key: str
    version: str
    images: tuple[Image, ...]

    @property
    def base_reference(self) -> str:
        return f"localhost/lorapool-base:{self.base_key}"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _key(payload: object) -> str:
    return digest(json.dumps(payload, sort_keys=True).encode())[:16]


def dockerignore_patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def dockerignore_admits(path: str, patterns: Sequence[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    admitted = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(c, glob) for c in candidates):
            admitted = negated
    return admitted


def context_files(paths: Sequence[str], dockerignore: str) -> list[str]:
    """The build context: the given repo-relative paths that .dockerignore admits, sorted."""
    patterns = dockerignore_patterns(dockerignore)
    return sorted(p for p in paths if dockerignore_admits(p, patterns))


def base_key(spec: BaseSpec) -> str:
    return _key({"recipe": RECIPE_VERSION, "base": spec.__dict__})


# What the image's Python needs that this machine's does not: the wheelhouse is made with this machine's
# pip, which skips a dependency whose marker only the image's older Python matches (redis-py asks for
# async-timeout below Python 3.11.3; Debian bookworm's is 3.11.2), and the build stage installs offline.
IMAGE_PYTHON_ONLY = ("async-timeout>=4.0.3",)


def wheelhouse_requirements(pyproject: str) -> list[str]:
    """What the build stage installs: the runtime dependencies, the build backend and what only the
    image's Python asks for (``IMAGE_PYTHON_ONLY``)."""
    data = tomllib.loads(pyproject)
    return [*data["build-system"]["requires"], *data["project"]["dependencies"], *IMAGE_PYTHON_ONLY]


def wheelhouse_key(requirements: Sequence[str], python: str, machine: str) -> str:
    return _key({"recipe": RECIPE_VERSION, "requirements": sorted(requirements), "python": python, "machine": machine})


def plan_build(
    *,
    version: str,
    dockerfile: bytes,
    context: Mapping[str, bytes],
    base: BaseSpec,
    requirements: Sequence[str],
    machine: str,
    out_dir: PurePath,
) -> BuildPlan:
    """The plan for the Dockerfile, the context files' contents and the base; the key covers all."""
    bkey = base_key(base)
    wkey = wheelhouse_key(requirements, base.python, machine)
    key = _key(
        {
            "recipe": RECIPE_VERSION,
            "version": version,
            "dockerfile": digest(dockerfile),
            "context": {path: digest(data) for path, data in sorted(context.items())},
            "base": bkey,
            "wheelhouse": wkey,
        }
    )
    images = tuple(
        Image(target, f"{repository}:{version}", out_dir / f"lorapool-{target}-{version}-{key}.oci.tar")
        for target, repository in TARGETS.items()
    )
    return BuildPlan(key=key, base_key=bkey, wheelhouse_key=wkey, version=version, images=images)


def buildah_build_argv(
    plan: BuildPlan,
    image: Image,
    *,
    dockerfile: PurePath,
    context_dir: PurePath,
    wheelhouse: PurePath,
    storage: Sequence[str],
) -> list[str]:
    """`buildah build` of one target of the Dockerfile in ``context_dir``, offline.

    chroot isolation (no user namespace needed, as root; it allows no network but the host's, so
    offline means the wheelhouse and ``--pull=never``: the base is local),
    with the wheelhouse mounted read-only for the RUN steps and named by the WHEELHOUSE arg.
    """
    return [
        "buildah",
        *storage,
        "build",
        "--isolation",
        "chroot",
        "--pull=never",
        "--layers",  # the second target reuses the first one's build and runtime-base stages
        "--target",
        image.target,
        "--build-arg",
        f"PYTHON_IMAGE={plan.base_reference}",
        "--build-arg",
        f"VERSION={plan.version}",
        "--build-arg",
        "WHEELHOUSE=/wheelhouse",
        "--volume",
        f"{wheelhouse}:/wheelhouse:ro",
        "--tag",
        image.reference,
        "--file",
        str(dockerfile),
        str(context_dir),
    ]
