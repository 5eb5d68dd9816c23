"""The README's parameter tables are the documentation of record: they must match the code."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import lorapool.sim
from lorapool.sim.cli import configure
from lorapool.sim.timing import timing_fields

README = (Path(lorapool.sim.__file__).parent / "README.md").read_text()


@pytest.mark.parametrize("field", timing_fields(), ids=lambda f: f.name)
def test_every_timing_parameter_has_a_row_with_its_default_and_source(field: dataclasses.Field[Any]) -> None:
    flag = "--" + field.name.replace("_", "-")
    row = f"| `{flag}` | {field.default} | {field.metadata['doc']} | {field.metadata['source']} |"
    assert row in README


def test_every_flag_is_documented() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}
    missing = sorted(flag for flag in flags - {"--help", "--log-level"} if f"`{flag}`" not in README)
    assert missing == []
