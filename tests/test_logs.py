"""One klog line format for every lorapool process."""

from __future__ import annotations

import logging
import re

import pytest

from lorapool.logs import KlogFormatter, WatchSuccessFilter


def record(msg: str, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    exc_info = extra.pop("exc_info", None)
    rec = logging.LogRecord("lorapool.test", level, "/src/agent.py", 88, msg, None, exc_info)  # type: ignore[arg-type]
    rec.__dict__.update(extra)
    return rec


@pytest.mark.parametrize(
    ("rec", "tail"),
    [
        (record("Loaded adapter", kv={"adapter": "sql", "rank": 8}), '"Loaded adapter" adapter="sql" rank=8'),
        (
            record("Marked backend down", backend="http://a", reason="503"),
            '"Marked backend down" backend="http://a" reason="503"',
        ),
        (record("Applied Deployment", settings=object(), k8s_skip=True, k8s_ref={"name": "p"}), '"Applied Deployment"'),
        (record("Skipped", kv={"error": None}), '"Skipped"'),
    ],
    ids=["kv-fields", "plain-extra-fields", "kopf-context-dropped", "none-omitted"],
)
def test_fields_follow_the_quoted_message(rec: logging.LogRecord, tail: str) -> None:
    line = KlogFormatter().format(rec)
    assert re.match(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ agent\.py:88\] ", line), line
    assert line.split("] ", 1)[1] == tail


def test_levels_and_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record("Failed to load", logging.ERROR, exc_info=sys.exc_info())
    line = KlogFormatter().format(rec)
    assert line.startswith("E") and line.splitlines()[-1] == "ValueError: boom"
    assert KlogFormatter().format(record("Slow", logging.WARNING)).startswith("W")


def _named(name: str, msg: str, level: int = logging.INFO) -> logging.LogRecord:
    rec = record(msg, level)
    rec.name = name
    return rec


@pytest.mark.parametrize(
    ("rec", "kept"),
    [
        (_named("kopf.objects", "Handler '_watch_adapters.<locals>.adapter_event' succeeded."), False),
        (_named("kopf.objects", "Handler 'x' failed with an exception. Will retry.", logging.ERROR), True),
        (_named("kopf.objects", "Handler 'x' succeeded.", logging.WARNING), True),
        (_named("kopf.activities.startup", "Initial authentication has finished."), True),
        (_named("lorapool.operator", "Handler 'x' succeeded."), True),
    ],
    ids=["kopf-watch-success-dropped", "failure-kept", "other-level-kept", "other-kopf-line-kept", "ours-kept"],
)
def test_only_kopfs_per_event_success_line_is_dropped(rec: logging.LogRecord, kept: bool) -> None:
    assert WatchSuccessFilter().filter(rec) is kept
