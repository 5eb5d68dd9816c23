"""The container image without a Docker engine: the Dockerfile's structure, the build context
that .dockerignore admits, and the wheel the build stage makes from exactly that context."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path

import pytest

import lorapool
from lorapool_dev.image.recipe import dockerignore_admits
from tests.delivery.helm import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and stages of a Dockerfile (continuations joined, comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or (stripped.startswith("#") and not pending):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), re.I)
            assert match, f"every stage is named: FROM {rest}"
            stages.append(Stage(match.group(2), match.group(1)))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, not {keyword}"
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


ARGS, STAGES = parse_dockerfile((REPO / "Dockerfile").read_text())
BY_NAME = {s.name: s for s in STAGES}
RUNTIME_STAGES = [s for s in STAGES if s.name != "build"]


def test_stages_build_then_slim_runtime_and_the_release_image_is_the_default_target() -> None:
    assert [s.name for s in STAGES] == ["build", "runtime-base", "sim", "books", "runtime"]
    assert STAGES[-1].name == "runtime", "`docker build .` builds the last stage: the release image"
    assert BY_NAME["build"].base == BY_NAME["runtime-base"].base == "${PYTHON_IMAGE}"
    assert BY_NAME["sim"].base == BY_NAME["runtime"].base == BY_NAME["books"].base == "runtime-base"


def test_base_image_is_an_exact_python_tag_matching_requires_python() -> None:
    image = ARGS["PYTHON_IMAGE"]
    match = re.fullmatch(r"python:(3\.\d+)(\.\d+)?-slim-bookworm(@sha256:[0-9a-f]{64})?", image)
    assert match, f"{image}: pin an exact python:<version>-slim-bookworm tag (optionally @sha256:<digest>)"
    assert PYPROJECT["project"]["requires-python"] == f">={match.group(1)}"


def test_image_version_is_the_package_version() -> None:
    assert ARGS["VERSION"] == lorapool.__version__ == PYPROJECT["project"]["version"]
    assert 'test "$(lorapool --version)" = "lorapool ${VERSION}"' in BY_NAME["runtime-base"].all("RUN")


def test_runtime_runs_the_console_script_as_uid_1000_without_build_tools() -> None:
    (script,) = PYPROJECT["project"]["scripts"]
    base = BY_NAME["runtime-base"]
    assert json.loads(base.all("ENTRYPOINT")[-1]) == [script]
    assert base.all("USER") == ["1000:1000"]  # the rendered pods use runAsUser 1000
    assert "useradd --uid 1000 --gid 1000" in " ".join(base.all("RUN"))
    for stage in RUNTIME_STAGES:
        runs = " ".join(stage.all("RUN"))
        if stage.name == "books":  # Debian's redis-server alone (test_books_target_...), nothing to build with
            continue
        for tool in ("apt-get", "apk ", "pip ", "gcc", "build-essential", "make "):
            assert tool not in runs, f"stage {stage.name} installs with {tool!r}: build in the build stage"
        for source in stage.all("COPY"):
            assert "--from=build" not in source or source.split()[-2:] == ["/opt/venv", "/opt/venv"], source


def test_books_target_is_debians_redis_server_as_uid_1000() -> None:
    """The rendered shared store's image (docs/high-availability.md): one package from Debian, back to uid
    1000 (the rendered Deployment's runAsUser), redis-server as its entry point, the apt lists dropped."""
    books = BY_NAME["books"]
    (run,) = books.all("RUN")
    assert "apt-get install -y --no-install-recommends redis-server " in run and "rm -rf /var/lib/apt/lists/*" in run
    for tool in ("pip ", "gcc", "build-essential", "make "):
        assert tool not in run
    assert books.all("USER") == ["root", "1000:1000"]
    assert json.loads(books.all("ENTRYPOINT")[-1]) == ["redis-server"]
    assert not books.all("COPY")


def test_only_the_sim_target_has_a_vllm_that_runs_the_simulator() -> None:
    assert BY_NAME["sim"].all("COPY") == ["--chmod=0755 e2e/vllm_shim.py /opt/venv/bin/vllm"]
    assert not BY_NAME["runtime"].all("COPY") and not BY_NAME["runtime-base"].all("COPY")[1:]


def build_context(dest: Path) -> list[str]:
    """Copy what .dockerignore admits from the git-tracked files (plus untracked ones the
    build needs) into `dest`; return the copied paths."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    files = [p.relative_to(REPO).as_posix() for p in REPO.rglob("*") if p.is_file() and ".git/" not in p.as_posix()]
    admitted = sorted(f for f in files if dockerignore_admits(f, patterns))
    for rel in admitted:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    return admitted


def test_dockerignore_admits_the_wheel_inputs_and_the_shim_only(tmp_path: Path) -> None:
    admitted = build_context(tmp_path)
    tops = {p.split("/")[0] for p in admitted}
    assert tops == {"pyproject.toml", "README.md", "operator", "e2e"}
    assert "e2e/vllm_shim.py" in admitted and "e2e/kind.sh" not in admitted
    assert any(p.startswith("operator/lorapool/") for p in admitted)
    assert not [p for p in admitted if p.startswith("operator/lorapool_dev/")], "the image carries no dev wing"
    assert not [p for p in admitted if "__pycache__" in p or p.endswith(".pyc") or ".egg-info/" in p]
    for copy in BY_NAME["build"].all("COPY"):
        for source in copy.split()[:-1]:
            assert (tmp_path / source).exists(), f"COPY {source} is not in the build context"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps` from the Docker build context, as the build stage runs it."""
    context = tmp_path_factory.mktemp("context")
    build_context(context)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(out), "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (whl,) = out.glob("lorapool-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_has_every_module_the_data_files_and_the_console_script(wheel: Path) -> None:
    assert wheel.name == f"lorapool-{lorapool.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "operator" / "lorapool"
    sources = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    modules = {f"lorapool/{p.relative_to(package).as_posix()}" for p in sources if p.suffix == ".py"}
    data = {f"lorapool/{p.relative_to(package).as_posix()}" for p in sources if p.suffix not in (".py", ".md", ".pyc")}
    assert modules <= names, sorted(modules - names)
    assert data <= names, f"runtime data missing from the wheel (add it to package-data): {sorted(data - names)}"
    assert not [n for n in names if n.startswith("lorapool_dev/")], "the image's wheel carries no dev wing"
    entry_points = zipfile.ZipFile(wheel).read(f"lorapool-{lorapool.__version__}.dist-info/entry_points.txt").decode()
    ((script, target),) = PYPROJECT["project"]["scripts"].items()
    assert f"[console_scripts]\n{script} = {target}" in entry_points


@pytest.mark.slow
def test_installed_wheel_runs_lorapool_and_finds_its_data(wheel: Path, tmp_path: Path) -> None:
    """Installed into a fresh virtualenv (dependencies from this interpreter), the console
    script runs the wheel's own code, not the working tree's."""
    # as a user's shell: no PYTHONPATH pointing at a source tree (flakes.py --clone sets one)
    user_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    version = subprocess.run(
        [env_dir / "bin" / "lorapool", "--version"], capture_output=True, text=True, check=True, env=user_env
    )
    assert version.stdout.strip() == f"lorapool {lorapool.__version__}"
    # The venv sees this interpreter's site-packages (the dependencies), where the editable install
    # maps lorapool_dev too: what the wheel installed is read from its own record instead.
    probe = (
        "import lorapool, importlib.metadata as m; print(lorapool.__file__); "
        "print(sum(str(f).startswith('lorapool_dev') for f in m.distribution('lorapool').files or ()))"
    )
    where, dev_files = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path, env=user_env
    ).stdout.split()
    assert where.startswith(str(env_dir)), where
    assert dev_files == "0", "the wheel built from the image's context installs no lorapool_dev"
    for command in ("operator", "router", "sidecar", "sim"):
        subprocess.run(
            [env_dir / "bin" / "lorapool", command, "--help"], capture_output=True, check=True, timeout=60, env=user_env
        )


def test_the_image_installs_the_wheel_without_extras() -> None:
    """The build stage installs the bare wheel: runtime dependencies only, checked by pip."""
    runs = " ".join(BY_NAME["build"].all("RUN"))
    assert re.findall(r"pip install (\S+)", runs) == ["/wheels/lorapool-*.whl"], runs
    assert "/opt/venv/bin/pip check" in runs


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def closure(names: set[str]) -> set[str]:
    """The distributions ``names`` pull in (installed metadata; extras' requirements left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib_metadata.requires(name) or []
        except importlib_metadata.PackageNotFoundError:
            continue
        todo += requirement_names([r for r in requires if "extra ==" not in r])
    return seen


DEV_TOOLING = ("lorapool_dev",)


def test_runtime_dependencies_are_what_runtime_code_imports_and_dev_tooling_has_its_own() -> None:
    """Every runtime dependency is imported by code that runs in a cluster, and a package only
    dev tooling imports (pytest: the local control plane's fixtures) is in the test extra, never
    in the runtime (so never in the image). cryptography is both: the local control plane's PKI
    and the picker's self-signed serving certificate."""
    import grimp

    graph = grimp.build_graph("lorapool", "lorapool_dev", include_external_packages=True)
    dists = {
        m: {d.lower().replace("_", "-") for d in ds} for m, ds in importlib_metadata.packages_distributions().items()
    }

    def third_party(modules: set[str]) -> set[str]:
        imported = {i for m in modules for i in graph.find_modules_directly_imported_by(m)}
        return {d for i in imported if not i.startswith("lorapool") for d in dists.get(i.split(".")[0], ())}

    package = {m for m in graph.modules if m.startswith("lorapool")}
    dev = {m for m in package if m.startswith(DEV_TOOLING)}
    runtime_imports, dev_imports = third_party(package - dev), third_party(dev)
    runtime = requirement_names(PYPROJECT["project"]["dependencies"])
    test_extra = requirement_names(PYPROJECT["project"]["optional-dependencies"]["test"])
    assert runtime <= runtime_imports, f"runtime dependencies nothing in a cluster imports: {runtime - runtime_imports}"
    dev_only = dev_imports - runtime_imports - {"lorapool"}
    assert "pytest" in dev_only
    assert "cryptography" in runtime_imports & dev_imports
    assert not dev_only & runtime, f"dev-only packages in the runtime dependencies: {dev_only & runtime}"
    installed_with_test = closure(runtime | test_extra)
    assert dev_only <= installed_with_test, f"`pip install lorapool[test]` lacks: {dev_only - installed_with_test}"


@pytest.mark.parametrize("command", [["cluster", "up", "--kubeconfig", "{tmp}/kubeconfig"], ["dev", "--once"]])
def test_dev_commands_without_the_test_extra_say_which_extra_to_install(command: list[str], tmp_path: Path) -> None:
    """With cryptography missing (as after `pip install lorapool`), the dev-only commands stop at
    once with the extra to install; nothing is built or started."""
    argv = [a.format(tmp=tmp_path) for a in command]
    hide = "import sys; sys.modules['cryptography'] = None; from lorapool.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", hide, *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: lorapool {command[0]} needs the test extra: pip install 'lorapool[test]' (cryptography is not installed)"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", [["dev", "--once"], ["cluster", "up"], ["engine", "--help"], ["image", "build"]])
def test_dev_commands_without_the_dev_package_say_how_to_get_it(command: list[str], tmp_path: Path) -> None:
    """Where lorapool_dev is absent (the image), every dev command stops before parsing its flags
    (even --help needs its module) with how to get the dev wing; nothing is built or started."""
    hide = "import sys; sys.modules['lorapool_dev'] = None; from lorapool.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", hide, *command], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: lorapool {command[0]} is development tooling (the lorapool_dev package), which this install does"
        " not carry (the image leaves it out): from a source checkout, pip install -e '.[test]'"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["router", "operator", "sidecar", "sim", "plan"])
def test_runtime_commands_do_not_import_dev_tooling(command: str) -> None:
    """`lorapool <runtime command>` configures only its own module: the dev tooling behind
    `cluster`, `dev` and `engine` is never imported in a pod."""
    probe = (
        "import sys; from lorapool.cli import main\n"
        "try:\n    main([sys.argv[1], '--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in sys.modules if m.startswith({DEV_TOOLING!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, command], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-2000:]
