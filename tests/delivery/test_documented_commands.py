"""Every command the docs give runs as a user types it: a subprocess from the repository root.

In-process checks read the parsers' source and miss what only a real invocation shows: ``python
bench/run.py --help`` died at import (``bench/numbers.py`` shadowed the standard library's
``numbers``, since a script's directory comes first on ``sys.path``) while every test passed. So
each documented command of the project's own (``lorapool ...``, ``python bench/...``, ``python -m
...``, ``scripts/...``, ``make ...``) is collected from the Markdown files (shell blocks and inline
code), and:

- the cheap ones that change nothing run for real (``lorapool plan|render -f <an example>``);
- the rest run as ``<program and subcommands> --help`` (a long run, a server, a cluster), and
  every ``--flag`` the docs use must appear in that help, so a renamed flag fails here;
- ``make`` targets must exist and ``make -n`` must expand them; scripts must exist and run ``--help``.

Other tools' commands (kubectl, helm, docker, pip, ...) are listed and left to the tests that run
those tools for real (tests/delivery/test_chart_install.py, tests/e2e). A command whose program is
in neither list fails, so a new kind of documented command must be given a rule here.
CHANGELOG.md is history and names commands as they were; it is not read.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lorapool.cli import COMMANDS
from tests.delivery.helm import REPO

DOCS = sorted(
    p
    for p in REPO.rglob("*.md")
    if ".git" not in p.parts and p.name != "CHANGELOG.md" and not {"node_modules", ".venv"} & set(p.parts)
)
SHELL_BLOCK = re.compile(r"```(sh|bash|shell|console)\n(.*?)```", re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PROGRAMS = {"lorapool", "python", "python3", "make"}
SCRIPT_DIRS = ("scripts/", "e2e/")
FOREIGN = {"kubectl", "helm", "docker", "pip", "yq", "export", "ruff", "cd", "git", "curl", "KEEP=1", "echo"}
# `lorapool X` that name a thing, not a command: the benchmark's systems, policies, placeholders.
NOT_COMMANDS = {"affinity", "placement", "round-robin", "least-loaded", "fair", "<policy>", "<command>", "<cmd>"}
# Example files a documented command reads when the user has one of their own.
PLACEHOLDER_FILES = {"pool.yaml", "pools/llama3-8b.yaml", "lorapool.yaml"}
CHEAP_SUBCOMMANDS = {"plan", "render"}  # offline, read one file, write nothing


@dataclass(frozen=True)
class Documented:
    where: str  # file:line
    words: tuple[str, ...]

    def __str__(self) -> str:
        return " ".join(self.words)


def ours(words: list[str]) -> bool:
    """A command of the project's own: one of its programs, or a script of its own (a path in the repo)."""
    return bool(words) and (words[0] in PROGRAMS or words[0].startswith(SCRIPT_DIRS))


def _commands_of(text: str, inline: bool = True) -> Iterator[tuple[int, str]]:
    """(line, command text) for each shell line of a fenced block and, with ``inline``, each inline
    code span (inline spans also name modules, flags and metrics: only those of our programs count)."""
    for block in SHELL_BLOCK.finditer(text):
        console = block.group(1) == "console"
        first = text.count("\n", 0, block.start(2)) + 1
        pending = ""
        for offset, raw in enumerate(block.group(2).splitlines()):
            line = raw.strip()
            if console:  # only the prompt lines are commands; the rest is their output
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            yield first + offset, pending + line
            pending = ""
    if inline:
        blocks = [b.span() for b in SHELL_BLOCK.finditer(text)]
        for match in INLINE.finditer(text):
            if " " in match.group(1) and not any(start <= match.start() < end for start, end in blocks):
                yield text.count("\n", 0, match.start()) + 1, match.group(1)


def _segments(command: str) -> Iterator[list[str]]:
    """The simple commands of a line: comments dropped, split on && ; | and redirections."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return
    current: list[str] = []
    for word in [*words, "&&"]:
        if word in {"&&", "||", ";", "|"} or word.startswith(">"):
            if current:
                yield current
            current = [] if word in {"&&", "||", ";", "|"} else ["<redirected>"]
        elif current != ["<redirected>"]:
            current.append(word)
    # an env assignment before the program is not the program
    return


def _strip_env(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    # a command whose output a variable takes: `digest=$(lorapool adapter push ...)` runs `lorapool ...`
    if words and (captured := re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\$\((\S+)", words[0])):
        words = [captured[1], *words[1:]]
        words[-1] = words[-1].removesuffix(")")
    return words


def documented() -> list[Documented]:
    found: dict[tuple[str, ...], Documented] = {}
    for path in DOCS:
        rel = path.relative_to(REPO).as_posix()
        for line, command in _commands_of(path.read_text()):
            for segment in _segments(command):
                words = _strip_env(segment)
                if not ours(words):
                    continue
                if words[0] in {"python", "python3"} and len(words) == 1:
                    continue
                if words[0] == "lorapool" and len(words) > 1 and words[1] in NOT_COMMANDS:
                    continue
                words = [w for w in words if w not in {"[", "]", "..."}]
                words = [w.strip("[]") for w in words]
                found.setdefault(tuple(words), Documented(f"{rel}:{line}", tuple(words)))
    return sorted(found.values(), key=str)


def foreign() -> set[str]:
    """First words of the shell blocks' lines that are other tools' commands (reported, not run)."""
    seen: set[str] = set()
    for path in DOCS:
        for _, command in _commands_of(path.read_text(), inline=False):
            for segment in _segments(command):
                words = _strip_env(segment)
                if words and words != ["<redirected>"] and not ours(words):
                    seen.add(Path(words[0]).name)  # ~/.cache/lorapool/bin/kubectl-v1.36.3/kubectl: kubectl
    return seen


COMMANDS_FOUND = documented()


def run(words: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``words`` as a user's shell would run them from the repository root (python is this one)."""
    env = {**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning:lorapool"}
    argv = [sys.executable, *words[1:]] if words[0] in {"python", "python3"} else words
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def _prefix(words: tuple[str, ...]) -> list[str]:
    """The program and its subcommands: the words before the first flag or positional argument."""
    program = list(words[:1])
    rest = list(words[1:])
    if program[0] in {"python", "python3"}:
        if rest[:1] == ["-m"]:
            program += rest[:2]
            rest = rest[2:]
        else:
            program += rest[:1]
            rest = rest[1:]
    elif program[0] == "lorapool":
        while rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]) and not rest[0].startswith("-"):
            program.append(rest.pop(0))
            if len(program) == 3:  # lorapool <command> <subcommand>
                break
    return program


@functools.cache
def help_of(prefix: tuple[str, ...]) -> str:
    result = run([*prefix, "--help"])
    assert result.returncode == 0, f"`{' '.join(prefix)} --help` exited {result.returncode}:\n{result.stderr[-2000:]}"
    return result.stdout


def flags(words: tuple[str, ...]) -> set[str]:
    return {w.split("=", 1)[0] for w in words if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", w)}


def test_the_docs_give_commands_of_every_kind() -> None:
    kinds = {c.words[0] if c.words[0] != "python3" else "python" for c in COMMANDS_FOUND}
    assert {"lorapool", "python", "make", "scripts/build-control-plane"} <= kinds, kinds
    assert any(c.words[:2] == ("python", "bench/run.py") for c in COMMANDS_FOUND)
    unknown = foreign() - FOREIGN
    assert not unknown, f"documented commands of programs with no rule in this test: {sorted(unknown)}"


@pytest.mark.parametrize("command", COMMANDS_FOUND, ids=str)
def test_documented_command_runs(command: Documented, tmp_path: Path) -> None:
    words = command.words
    program = words[0]
    if program == "make":
        targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
        result = subprocess.run(
            ["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, f"{command.where}: `make -n {' '.join(words[1:])}`: {result.stderr}"
        assert targets, f"{command.where}: make with no target"
        return
    if program.startswith(("scripts/", "e2e/")):
        script = REPO / program
        assert script.is_file() and os.access(script, os.X_OK), f"{command.where}: {program} is not an executable file"
        if script.suffix == ".sh":  # e2e/kind.sh needs Docker and kind: its syntax is what can be checked here
            assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0
            return
        assert flags(words) <= flags(tuple(help_of((program,)).split())) | {"--help"}, command.where
        return
    prefix = _prefix(words)
    if program == "lorapool" and len(prefix) == 1 and words[1:] == ("--version",):
        result = run(["lorapool", "--version"])
        assert result.returncode == 0 and result.stdout.startswith("lorapool "), f"{command.where}: {result.stderr}"
        return
    if program == "lorapool":
        assert len(prefix) > 1 and prefix[1] in COMMANDS, f"{command.where}: `lorapool {prefix[1:]}` is no command"
    args = words[len(prefix) :]
    files = [a for a in args if a.endswith((".yaml", ".yml"))]
    if program == "lorapool" and prefix[1] in CHEAP_SUBCOMMANDS and files:
        example = REPO / "examples" / "lorapool.yaml"
        real = [str(example) if f in PLACEHOLDER_FILES else f for f in args]
        result = run([*prefix, *real])
        assert result.returncode == 0, f"{command.where}: `{command}` exited {result.returncode}: {result.stderr}"
        assert result.stdout.strip(), f"{command.where}: `{command}` printed nothing"
        return
    text = help_of(tuple(prefix))
    missing = {f for f in flags(tuple(args)) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)}
    assert not missing, f"{command.where}: `{command}` uses {sorted(missing)}, which `{' '.join(prefix)} --help` lacks"


def _sys_path_dirs() -> set[Path]:
    """Directories Python puts first on sys.path: the repository root and operator/ (``-m``,
    PYTHONPATH) and the directory of every script run by its path (``python bench/run.py``). The
    packages' own modules (lorapool, lorapool_dev) run with ``-m``, which puts the working
    directory there, not theirs."""
    dirs = {REPO, REPO / "operator"}
    packages = (REPO / "operator" / "lorapool", REPO / "operator" / "lorapool_dev")
    for path in REPO.rglob("*.py"):
        if ".git" in path.parts or any(package in path.parents for package in packages):
            continue
        head = path.read_text(errors="replace")
        if head.startswith("#!") or re.search(r"^if __name__ == .__main__.:", head, re.M):
            dirs.add(path.parent)
    return dirs


def test_no_module_a_script_can_import_shadows_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names)
    shadows = []
    for directory in _sys_path_dirs():
        for entry in directory.iterdir():
            name = entry.stem if entry.suffix == ".py" else entry.name
            is_module = entry.suffix == ".py" or (entry.is_dir() and (entry / "__init__.py").exists())
            if is_module and name in stdlib:
                shadows.append(entry.relative_to(REPO).as_posix())
    # operator/ itself is no package (no __init__.py), so it never shadows the operator module.
    assert not shadows, f"these would shadow the standard library for a script beside them: {shadows}"
