"""CONTRIBUTING.md tells the truth: the make targets, lorapool commands, extras, bench flags,
scenario and system names and environment variables it names all exist."""

from __future__ import annotations

import itertools
import re
import shlex
import tomllib

import pytest

from lorapool.cli import COMMANDS
from tests.delivery.helm import REPO

TEXT = (REPO / "CONTRIBUTING.md").read_text()
COMMAND_LINES = [
    line.split("#")[0].strip() for block in re.findall(r"```sh\n(.*?)```", TEXT, re.S) for line in block.splitlines()
]


def lines_starting(prefix: str) -> list[list[str]]:
    return [shlex.split(line) for line in COMMAND_LINES if line.startswith(prefix)]


def test_make_targets_exist() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = {words[1] for words in lines_starting("make ")} | set(re.findall(r"`make (\w+)", TEXT))
    assert named, "CONTRIBUTING.md names no make target"
    assert named <= targets, f"CONTRIBUTING.md names make targets the Makefile lacks: {named - targets}"


def test_lint_line_lists_what_make_lint_runs() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^lint:\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile has no lint target"
    # "ruff check" and "ruff format" are two checks; every other line is named by its tool
    tools = [" ".join(w[:2]) if w[0] == "ruff" else w[0] for w in map(str.split, recipe.group(1).splitlines())]
    (described,) = [line for line in COMMAND_LINES if line == "make lint"]
    comment = next(line for line in TEXT.splitlines() if line.startswith("make lint"))
    assert described and all(tool in comment for tool in tools), (
        f"make lint runs {tools}; CONTRIBUTING.md says {comment!r}"
    )


def test_lorapool_commands_exist() -> None:
    named = {words[1] for words in lines_starting("lorapool ")} | set(re.findall(r"`lorapool (\w+)", TEXT))
    assert {"dev", "plan", "render", "router", "cluster"} <= named
    assert named <= set(COMMANDS), named - set(COMMANDS)


def test_extras_exist() -> None:
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {e for group in re.findall(r"\.\[([\w,]+)\]", TEXT) for e in group.split(",")}
    assert named == {"test", "bench"} <= extras


@pytest.mark.parametrize("words", lines_starting("python bench/run.py"), ids=" ".join)
def test_bench_invocations_use_real_flags_scenarios_and_systems(words: list[str]) -> None:
    from bench.scenarios import SCENARIOS, SYSTEMS

    flags = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", (REPO / "bench" / "run.py").read_text()))
    used = [w for w in words if w.startswith("--")]
    assert set(used) <= flags, set(used) - flags
    values = dict(itertools.pairwise(words))
    if "--only" in values:
        assert set(values["--only"].split(",")) <= {s.name for s in SCENARIOS}
    if "--systems" in values:
        assert set(values["--systems"].split(",")) <= {s.name for s in SYSTEMS}


def test_golden_variable_is_the_one_the_render_tests_read() -> None:
    assert "LORAPOOL_UPDATE_GOLDEN=1" in TEXT
    assert 'os.environ.get("LORAPOOL_UPDATE_GOLDEN")' in (REPO / "tests" / "render" / "test_render.py").read_text()


def _layout_entries() -> dict[str, set[str]]:
    """The Layout block's entries per package: ``{"operator/lorapool": {"api", "cli.py", ...}}``."""
    (block,) = re.findall(r"## Layout\n.*?```text\n(.*?)```", TEXT, re.S)
    entries: dict[str, set[str]] = {}
    package = ""
    for line in block.splitlines():
        if not line.startswith(" "):
            package = line.split()[0].rstrip("/")
            entries[package] = set()
            continue
        names = line.strip().split("  ")[0].split()  # the names before the description's wide gap
        entries[package] |= {n.rstrip("/") for n in names}
    return entries


def test_layout_lists_every_subpackage_and_module_of_both_packages() -> None:
    """The Layout block and the tree agree: every subpackage and top-level module of lorapool and
    lorapool_dev is listed, and every listed name exists."""
    entries = _layout_entries()
    assert set(entries) == {"operator/lorapool", "operator/lorapool_dev"}
    for package, listed in entries.items():
        root = REPO / package
        tree = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
        tree |= {p.name for p in root.glob("*.py") if p.name != "__init__.py"}
        assert listed == tree, (
            f"{package}: listed but absent {sorted(listed - tree)}, present but unlisted {sorted(tree - listed)}"
        )
