"""The project's images as a user gets them: built from the Dockerfile with `lorapool image build`
(buildah, no Docker), imported into containerd and run there as a node runs a pod: uid 1000,
read-only root filesystem, HOME on a tmpfs.

A cold run builds the base rootfs, the wheelhouse and both targets (minutes, see CONTRIBUTING.md
"Images"); a warm run finds the archives by content key. Needs root (buildah, containerd); the
Debian tools are installed when missing (`lorapool_dev.image.build.install_tools`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import lorapool
from lorapool_dev.image.build import build_images
from lorapool_dev.image.containerd import Containerd, running_containerd
from lorapool_dev.image.recipe import TARGETS, Image
from lorapool_dev.testing.http import request
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.wait import wait_until

pytestmark = [
    pytest.mark.images,
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah and containerd need root here"),
]

COLD_BUILD_TIMEOUT_S = 1200  # the first test pays the session's build: debootstrap, wheels, two targets


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    return {image.target: image for image in build_images()}


@pytest.fixture(scope="module")
def containerd(images: dict[str, Image]) -> Iterator[Containerd]:
    with running_containerd() as daemon:
        for image in images.values():
            daemon.import_archive(Path(image.archive))
        yield daemon


@pytest.mark.timeout(COLD_BUILD_TIMEOUT_S)
def test_a_warm_build_prints_one_line_per_image_in_seconds(images: dict[str, Image], tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", "image", "build", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[0] for line in lines] == list(TARGETS)
    for target, reference, archive in lines:
        assert reference == images[target].reference == f"{TARGETS[target]}:{lorapool.__version__}"
        assert Path(archive).parent == tmp_path.resolve() and Path(archive).stat().st_size > 10_000_000
    assert seconds < 10, f"a warm `lorapool image build` took {seconds:.1f} s: the cache was not used"


@pytest.mark.timeout(COLD_BUILD_TIMEOUT_S)
@pytest.mark.parametrize("target", list(TARGETS))
def test_the_image_runs_as_uid_1000_on_a_read_only_root_with_home_on_tmpfs(
    containerd: Containerd, images: dict[str, Image], target: str
) -> None:
    ref = images[target].reference
    assert (
        containerd.run(ref, f"version-{target}", ["lorapool", "--version"]).strip()
        == f"lorapool {lorapool.__version__}"
    )
    probe = 'id -u; id -g; echo "$HOME"; touch /probe 2>/dev/null && echo root-writable; touch "$HOME/probe" && echo home-ok'
    assert containerd.run(ref, f"user-{target}", ["sh", "-c", probe]).split() == ["1000", "1000", "/tmp", "home-ok"]


@pytest.mark.timeout(COLD_BUILD_TIMEOUT_S)
@pytest.mark.parametrize("target", list(TARGETS))
def test_no_compiler_or_build_tool_in_the_image(containerd: Containerd, images: dict[str, Image], target: str) -> None:
    tools = "gcc cc c++ g++ clang make ld as"
    found = containerd.run(
        images[target].reference, f"tools-{target}", ["sh", "-c", f"for t in {tools}; do command -v $t; done; true"]
    )
    assert found.strip() == "", f"the {target} image carries build tools: {found.split()}"


@pytest.mark.timeout(COLD_BUILD_TIMEOUT_S)
def test_only_the_sim_image_has_a_vllm(containerd: Containerd, images: dict[str, Image]) -> None:
    which = ["sh", "-c", "command -v vllm || echo none"]
    assert containerd.run(images["runtime"].reference, "vllm-runtime", which).strip() == "none"
    assert containerd.run(images["sim"].reference, "vllm-sim", which).strip() == "/opt/venv/bin/vllm"


@pytest.mark.timeout(COLD_BUILD_TIMEOUT_S)
def test_the_sim_image_vllm_serve_answers_on_a_port(containerd: Containerd, images: dict[str, Image]) -> None:
    port = free_port()
    name = "sim-serve"
    serve = [
        "vllm",
        "serve",
        "tiny-model",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-lora",
        "--max-loras",
        "2",
    ]
    serve += ["--dtype", "bfloat16"]  # a flag the shim drops, as the renderer emits it
    started = containerd.ctr(*containerd.run_argv(images["sim"].reference, name, serve, detach=True))
    assert started.returncode == 0, started.stderr
    try:
        models = wait_until(
            "the sim image's vllm serve to answer /v1/models",
            lambda: (r := request(f"http://127.0.0.1:{port}/v1/models", timeout_s=2)).status == 200 and r.json(),
            timeout_s=60,
        )
        assert [m["id"] for m in models["data"]] == ["tiny-model"]
        reply = request(
            f"http://127.0.0.1:{port}/v1/completions", "POST", {"model": "tiny-model", "prompt": "hi", "max_tokens": 4}
        )
        assert reply.status == 200 and reply.json()["choices"], reply.text
    finally:
        containerd.stop(name)
