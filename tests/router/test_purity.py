"""The router's policy core stays pure: no event loop, HTTP or Kubernetes imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lorapool.router

ROUTER = Path(lorapool.router.__file__).parent
PURE = sorted(
    [ROUTER / f"{name}.py" for name in ("backend", "policy", "plugin", "pickers", "registry", "state",
                                         "waitqueue", "engine_metrics", "discovery")]
    + list((ROUTER / "filters").glob("*.py"))
    + list((ROUTER / "scorers").glob("*.py"))
)  # fmt: skip
FORBIDDEN = {"asyncio", "aiohttp", "kubernetes", "kopf", "socket", "urllib", "http", "threading"}
SHELL = {"app", "scheduler", "server", "poller", "endpointslices", "telemetry", "cli", "settings"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROUTER)))
def test_pure_module_imports_no_io(path: Path) -> None:
    names = imported(path)
    assert not {n.split(".")[0] for n in names} & FORBIDDEN, names
    shell = {n for n in names if n.startswith("lorapool.router.") and n.split(".")[2] in SHELL}
    assert not shell, f"{path.name} imports the shell: {shell}"
