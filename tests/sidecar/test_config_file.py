"""What a re-read of the sidecar's config decides (sidecar/config.py ``ConfigFile``): pure tables."""

from __future__ import annotations

import pytest

from lorapool.sidecar.config import ConfigFile

GOOD, BAD, OTHER = b'{"good": 1}', b"{bad", b'{"other": 2}'
APPLIED = ConfigFile(applied=GOOD)
REFUSED = ConfigFile(applied=GOOD, refused=BAD, error="config: not valid JSON")
UNREADABLE = ConfigFile(applied=GOOD, error="config: cannot read it")

READS = {
    # id: (memory, text read) -> (must parse, error after)
    "first-read-parses": (ConfigFile(), GOOD, True, None),
    "unchanged-is-not-parsed": (APPLIED, GOOD, False, None),
    "changed-is-parsed": (APPLIED, OTHER, True, None),
    "the-refused-text-stays-refused": (REFUSED, BAD, False, "config: not valid JSON"),
    "a-new-text-after-a-refusal-is-parsed": (REFUSED, OTHER, True, "config: not valid JSON"),
    # the applied text back after a refusal is not parsed again, and (as before this module) the
    # refusal still shows until the text changes or a SIGHUP forces a re-apply
    "back-to-the-applied-text-keeps-the-error": (REFUSED, GOOD, False, "config: not valid JSON"),
    "readable-again-and-unchanged-clears-the-error": (UNREADABLE, GOOD, False, None),
    "forgotten-parses-again": (APPLIED.forget(), GOOD, True, None),
}


@pytest.mark.parametrize(("memory", "raw", "parse", "error"), list(READS.values()), ids=list(READS))
def test_read(memory: ConfigFile, raw: bytes, parse: bool, error: str | None) -> None:
    after, must_parse = memory.read(raw)
    assert (must_parse, after.error) == (parse, error)


REFUSALS = {
    # id: (text, message, adapters kept) -> memory after
    "no-good-set-yet": (BAD, "config: bad", None, ConfigFile(applied=GOOD, refused=BAD, error="config: bad")),
    "the-last-good-set-keeps-serving": (
        BAD,
        "config: bad",
        3,
        ConfigFile(applied=GOOD, refused=BAD, error="config: bad; keeping the last good set of 3 adapters"),
    ),
    "unreadable-refuses-no-text": (
        None,
        "config: cannot read it",
        0,
        ConfigFile(applied=GOOD, error="config: cannot read it; keeping the last good set of 0 adapters"),
    ),
}


@pytest.mark.parametrize(("raw", "message", "kept", "after"), list(REFUSALS.values()), ids=list(REFUSALS))
def test_refuse(raw: bytes | None, message: str, kept: int | None, after: ConfigFile) -> None:
    assert APPLIED.refuse(raw, message, kept=kept) == after


def test_apply_forgets_refusals_and_errors() -> None:
    assert REFUSED.apply(OTHER) == ConfigFile(applied=OTHER)
    assert REFUSED.forget() == ConfigFile(error="config: not valid JSON")  # the error shows until a read settles it
