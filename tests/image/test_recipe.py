"""The pure core of `lorapool image build`: the build context, the content keys, the buildah argv."""

from __future__ import annotations

from pathlib import Path, PurePath

import pytest

import lorapool
from lorapool_dev.image.recipe import (
    IMAGE_PYTHON_ONLY,
    TARGETS,
    BaseSpec,
    BuildPlan,
    buildah_build_argv,
    context_files,
    plan_build,
    wheelhouse_requirements,
)

REPO = Path(__file__).resolve().parents[2]
DOCKERIGNORE = "*\n!pyproject.toml\n!operator/\n!e2e/vllm_shim.py\n**/__pycache__\n"


def plan(**changes: object) -> BuildPlan:
    inputs: dict[str, object] = {
        "version": "0.1.0",
        "dockerfile": b"FROM x AS build\n",
        "context": {"pyproject.toml": b"[project]\n", "operator/lorapool/cli.py": b"print()\n"},
        "base": BaseSpec(),
        "requirements": ["setuptools>=69", "PyYAML>=6"],
        "machine": "x86_64",
        "out_dir": PurePath("/cache/images/oci"),
    }
    inputs.update(changes)
    return plan_build(**inputs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "admitted"),
    [
        ("pyproject.toml", True),
        ("operator/lorapool/cli.py", True),
        ("operator/lorapool/__pycache__/cli.cpython-311.pyc", False),
        ("e2e/vllm_shim.py", True),
        ("e2e/kind.sh", False),
        ("tests/test_x.py", False),
        ("Dockerfile", False),
    ],
    ids=["pyproject", "package source", "bytecode", "the shim", "other e2e files", "tests", "the Dockerfile itself"],
)
def test_the_context_is_what_dockerignore_admits(path: str, admitted: bool) -> None:
    assert (context_files([path], DOCKERIGNORE) == [path]) is admitted


@pytest.mark.parametrize(
    "change",
    [
        {"dockerfile": b"FROM y AS build\n"},
        {"context": {"pyproject.toml": b"[project]\n", "operator/lorapool/cli.py": b"print(1)\n"}},
        {"context": {"pyproject.toml": b"[project]\n"}},
        {"base": BaseSpec(suite="trixie")},
        {"requirements": ["setuptools>=69", "PyYAML>=7"]},
        {"version": "0.2.0"},
    ],
    ids=["the Dockerfile", "a source file", "a file removed", "the base", "a dependency", "the version"],
)
def test_every_input_changes_the_key(change: dict[str, object]) -> None:
    assert plan(**change).key != plan().key


def test_the_output_directory_does_not_change_the_key_and_names_the_archives() -> None:
    here, there = plan(), plan(out_dir=PurePath("/elsewhere"))
    assert here.key == there.key
    assert [i.target for i in here.images] == list(TARGETS) == ["runtime", "sim"]
    runtime = here.images[0]
    assert runtime.reference == "ghcr.io/lorapool/lorapool:0.1.0"
    assert runtime.archive == PurePath(f"/cache/images/oci/lorapool-runtime-0.1.0-{here.key}.oci.tar")
    assert runtime.line() == f"runtime ghcr.io/lorapool/lorapool:0.1.0 {runtime.archive}"


def test_the_release_reference_is_the_one_the_operator_and_chart_default_to() -> None:
    from lorapool.api.models import DEFAULT_LORAPOOL_IMAGE

    assert f"{TARGETS['runtime']}:{lorapool.__version__}" == DEFAULT_LORAPOOL_IMAGE


def test_buildah_builds_the_target_offline_from_the_local_base_with_the_wheelhouse() -> None:
    p = plan()
    argv = buildah_build_argv(
        p,
        p.images[1],
        dockerfile=PurePath("/repo/Dockerfile"),
        context_dir=PurePath("/ctx"),
        wheelhouse=PurePath("/wh"),
        storage=["--root", "/s"],
    )
    assert argv[:4] == ["buildah", "--root", "/s", "build"]
    assert argv[argv.index("--target") + 1] == "sim"
    assert "--pull=never" in argv and argv[argv.index("--isolation") + 1] == "chroot"
    build_args = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    assert build_args == [
        f"PYTHON_IMAGE=localhost/lorapool-base:{p.base_key}",
        "VERSION=0.1.0",
        "WHEELHOUSE=/wheelhouse",
    ]
    assert argv[argv.index("--volume") + 1] == "/wh:/wheelhouse:ro"
    assert argv[-3:] == ["--file", "/repo/Dockerfile", "/ctx"]


def test_the_wheelhouse_holds_the_build_backend_and_the_runtime_dependencies() -> None:
    import tomllib

    pyproject = (REPO / "pyproject.toml").read_text()
    data = tomllib.loads(pyproject)
    expected = data["build-system"]["requires"] + data["project"]["dependencies"] + list(IMAGE_PYTHON_ONLY)
    assert wheelhouse_requirements(pyproject) == expected


def test_the_dockerfile_ignores_an_empty_wheelhouse() -> None:
    """A plain `docker build` passes no WHEELHOUSE: pip then uses the index, as before."""
    text = (REPO / "Dockerfile").read_text()
    assert "ARG WHEELHOUSE=\n" in text
    assert 'if [ -n "$WHEELHOUSE" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"; fi' in text


def test_the_base_stands_in_for_python_slim_with_the_python_requires_python_names() -> None:
    import tomllib

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={BaseSpec().python}"
    assert "python-is-python3" in BaseSpec().packages  # the Dockerfile runs `python -m venv`
