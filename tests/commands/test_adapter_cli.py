"""`lorapool adapter push|pull` as CI runs them, against a real registry: stdout is the digest alone,
verification comes first (and says against what), credentials from a docker config or stdin, and
bad inputs end in one named error with nothing pushed."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.registry import Registry, run_registry

pytestmark = pytest.mark.timeout(180)

DIGEST_LINE = re.compile(r"^sha256:[0-9a-f]{64}\n$")
# The shape write_peft_adapter's tensors fit: 64 wide, 2 layers, 4 heads of 16.
BASE_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 128,
}


def lorapool(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lorapool.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("plain")) as registry:
        yield registry


@pytest.fixture(scope="module")
def basic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("basic"), auth="htpasswd", tls=True) as registry:
        yield registry


@pytest.fixture
def base_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE_CONFIG))
    return path


def test_push_prints_the_digest_alone_and_pull_gets_the_same_files(
    tmp_path: Path, plain: Registry, base_config: Path
) -> None:
    adapter = write_peft_adapter(tmp_path / "adapter", rank=8)
    ref = f"oci://{plain.host}/team/sql-coder:v1"
    pushed = lorapool("adapter", "push", str(adapter), ref, "--plain-http", "--base-config", str(base_config))
    assert pushed.returncode == 0, pushed.stderr
    assert DIGEST_LINE.match(pushed.stdout), pushed.stdout
    assert f"against --base-config {base_config}" in pushed.stderr and "verified weights against" in pushed.stderr
    digest = pushed.stdout.strip()

    for source in (ref, f"oci://{plain.host}/team/sql-coder@{digest}"):
        out = tmp_path / f"pulled-{len(source)}"
        pulled = lorapool("adapter", "pull", source, str(out), "--plain-http")
        assert pulled.returncode == 0, pulled.stderr
        assert pulled.stdout == f"{digest}\n"
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in adapter.iterdir())
        for f in adapter.iterdir():
            assert (out / f.name).read_bytes() == f.read_bytes()


def test_push_verifies_against_the_planners_dimensions_of_the_named_base(tmp_path: Path, plain: Registry) -> None:
    """The adapter names Llama 3 8B (the planner knows its shape), but its tensors are 64 wide."""
    adapter = write_peft_adapter(tmp_path / "adapter", rank=8)
    ref = f"oci://{plain.host}/misfit:v1"
    pushed = lorapool("adapter", "push", str(adapter), ref, "--plain-http")
    assert pushed.returncode == 1 and pushed.stdout == ""
    assert "against the planner's dimensions of llama-3-8b" in pushed.stderr
    assert "expects [8, 4096]" in pushed.stderr and "Traceback" not in pushed.stderr
    pulled = lorapool("adapter", "pull", ref, str(tmp_path / "out"), "--plain-http")
    assert pulled.returncode == 1 and "(NAME_UNKNOWN)" in pulled.stderr  # nothing was pushed


def test_push_of_an_adapter_for_an_unknown_base_checks_config_and_weights_and_says_so(
    tmp_path: Path, plain: Registry
) -> None:
    adapter = write_peft_adapter(tmp_path / "adapter", rank=8, base_model="acme/own-model")
    pushed = lorapool("adapter", "push", str(adapter), f"oci://{plain.host}/own:v1", "--plain-http")
    assert pushed.returncode == 0, pushed.stderr
    assert DIGEST_LINE.match(pushed.stdout)
    assert "config and weights only (no known dimensions for 'acme/own-model'" in pushed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["oci://127.0.0.1:5000/x@sha256:" + "0" * 64], "push needs a tag and no digest"),
        (["oci://127.0.0.1:5000/Upper:v1"], "an oci:// source is oci://<registry>[:<port>]/<repository>:<tag>"),
        (["oci://127.0.0.1:5000/x:v1", "--username", "u"], "--username and --password-stdin go together"),
    ],
)
def test_push_refuses_bad_references_and_flags(tmp_path: Path, args: list[str], message: str) -> None:
    adapter = write_peft_adapter(tmp_path / "adapter", rank=8, base_model="acme/own-model")
    pushed = lorapool("adapter", "push", str(adapter), *args, "--plain-http")
    assert pushed.returncode == 1 and pushed.stdout == ""
    assert message in pushed.stderr and "Traceback" not in pushed.stderr


def test_push_refuses_a_directory_without_an_adapter(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    pushed = lorapool("adapter", "push", str(tmp_path / "empty"), "oci://127.0.0.1:5000/x:v1")
    assert pushed.returncode == 1 and "no adapter_config.json found" in pushed.stderr


def test_credentials_from_the_docker_config_or_stdin(tmp_path: Path, basic: Registry, base_config: Path) -> None:
    assert basic.ca_file is not None and basic.password is not None and basic.username is not None
    adapter = write_peft_adapter(tmp_path / "adapter", rank=8)
    ref = f"oci://{basic.host}/private:v1"
    tls = ["--ca-file", str(basic.ca_file), "--base-config", str(base_config)]

    anonymous = lorapool("adapter", "push", str(adapter), ref, *tls, env={"DOCKER_CONFIG": str(tmp_path / "none")})
    assert anonymous.returncode == 1 and "unauthorized" in anonymous.stderr

    wrong = lorapool(
        "adapter",
        "push",
        str(adapter),
        ref,
        *tls,
        "--username",
        basic.username,
        "--password-stdin",
        stdin="not-the-password-42\n",
    )
    assert wrong.returncode == 1 and "unauthorized" in wrong.stderr and "not-the-password-42" not in wrong.stderr

    by_stdin = lorapool(
        "adapter",
        "push",
        str(adapter),
        ref,
        *tls,
        "--username",
        basic.username,
        "--password-stdin",
        stdin=basic.password + "\n",
    )
    assert by_stdin.returncode == 0, by_stdin.stderr

    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(f"{basic.username}:{basic.password}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {f"https://{basic.host}": {"auth": auth}}}))
    pulled = lorapool(
        "adapter",
        "pull",
        ref,
        str(tmp_path / "out"),
        "--ca-file",
        str(basic.ca_file),
        env={"DOCKER_CONFIG": str(docker)},
    )
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout == by_stdin.stdout
    assert basic.password not in pulled.stderr + by_stdin.stderr


def test_pull_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    pulled = lorapool("adapter", "pull", "oci://127.0.0.1:5000/x:v1", str(tmp_path / "out"))
    assert pulled.returncode == 1 and "is not an empty directory" in pulled.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
