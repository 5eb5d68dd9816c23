"""Code health: no function longer than 60 lines, no module longer than 600 (pure, reads the
source only).

A long function decides and acts at once (STYLE.md, "Grow out of"); each one is split by what it
does into named helpers. A long module holds more than one concept; it is split by meaning (a
resource, an object kind), not by line count. Function length is the AST's
``end_lineno - lineno + 1`` of every ``def`` and ``async def``, methods and nested functions
included; module length is its line count. The function cap covers both packages and the
benchmark; the module cap covers both packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "operator" / "lorapool", ROOT / "operator" / "lorapool_dev")
FUNCTION_TREES = (*PACKAGES, ROOT / "bench")
MAX_LINES = 60
MAX_MODULE_LINES = 600

# Functions allowed over the limit while a change that splits them is in flight (each entry with
# its reason); empty now.
BEING_SPLIT: set[str] = set()


def _sources(trees: tuple[Path, ...]) -> list[Path]:
    return sorted(p for tree in trees for p in tree.rglob("*.py") if "__pycache__" not in p.parts)


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in ``tree`` with its qualified name (Class.method, outer.inner)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((prefix + node.name, node))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        else:
            found += _functions(node, prefix)
    return found


def long_functions() -> dict[str, tuple[int, int]]:
    """``{"path:Qual.name": (line, length)}`` for every function longer than MAX_LINES."""
    long: dict[str, tuple[int, int]] = {}
    for path in _sources(FUNCTION_TREES):
        where = path.relative_to(ROOT).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), filename=str(path))):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_LINES:
                long[f"{where}:{name}"] = (node.lineno, length)
    return long


def long_modules() -> dict[str, int]:
    """``{"path": lines}`` for every module of either package longer than MAX_MODULE_LINES."""
    lengths = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _sources(PACKAGES)}
    return {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES}


def test_no_function_is_longer_than_60_lines() -> None:
    long = long_functions()
    offenders = [
        f"{key.split(':')[0]}:{line} {key.split(':')[1]} is {length} lines"
        for key, (line, length) in sorted(long.items())
        if key not in BEING_SPLIT
    ]
    assert not offenders, f"functions longer than {MAX_LINES} lines; split each by what it does:\n" + "\n".join(
        offenders
    )


def test_every_function_being_split_is_still_long() -> None:
    """An entry of BEING_SPLIT that is short again (or gone) is stale: remove it."""
    stale = sorted(BEING_SPLIT - set(long_functions()))
    assert not stale, f"no longer longer than {MAX_LINES} lines, remove from BEING_SPLIT: {stale}"


def test_no_module_is_longer_than_600_lines() -> None:
    offenders = [f"{path} is {n} lines" for path, n in sorted(long_modules().items())]
    assert not offenders, f"modules longer than {MAX_MODULE_LINES} lines; split each by meaning:\n" + "\n".join(
        offenders
    )


def test_the_caps_read_every_tree() -> None:
    """The caps are not vacuous: each tree they read has modules, and the bench is among them."""
    for tree in FUNCTION_TREES:
        assert list(tree.rglob("*.py")), f"{tree} has no module: the cap reads nothing there"
    assert any(p.parent.name == "bench" for p in _sources(FUNCTION_TREES))
