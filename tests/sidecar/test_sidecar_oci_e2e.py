"""oci:// through the real sidecar into the real simulator: an adapter pushed by ``lorapool adapter push``
to a real registry is loaded by tag and by digest, the digest it resolved to is in the sidecar's report,
a moved tag never swaps a loaded adapter's files, and a bad reference fails with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sidecar_procs import ConfigMapDir, adapter_set, engine_adapters, start_sidecar

from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.registry import Registry, run_registry

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
BASE_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 128,
}


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    with run_registry(tmp_path / "registry") as running:
        # What the renderer gives the sidecar for spec.credentials.oci.plainHTTP (the process inherits it).
        monkeypatch.setenv("LORAPOOL_OCI_PLAIN_HTTP", running.host)
        yield running


def _push(adapter: Path, reference: str) -> str:
    """Push with the CLI, verified against the shape write_peft_adapter's tensors fit (64 wide, 2 layers)."""
    base = adapter.parent / "base-config.json"
    base.write_text(json.dumps(BASE_CONFIG))
    argv = ["adapter", "push", str(adapter), reference, "--plain-http", "--base-config", str(base)]
    pushed = subprocess.run(
        [sys.executable, "-m", "lorapool.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return pushed.stdout.strip()


def test_an_adapter_pushed_by_the_cli_is_loaded_by_tag_then_by_digest(
    tmp_path: Path, registry: Registry, sim: RunningProcess, engine_port: int
) -> None:
    tag = f"oci://{registry.host}/team/sql-coder:v1"
    first = _push(write_peft_adapter(tmp_path / "v1", rank=8, seed=1), tag)
    cfg = ConfigMapDir(tmp_path / "cfg")
    cfg.write(
        adapter_set(
            [
                {"name": "sql", "source": tag},
                {"name": "gone", "source": f"oci://{registry.host}/team/nobody:v1"},
            ]
        )
    )
    sidecar = start_sidecar(cfg.path, engine_port, tmp_path / "adapters")
    try:
        sidecar.wait_phase("sql", "Loaded", rank=8, resolvedRevision=first)
        failed = sidecar.wait_phase("gone", "Failed")
        assert "unknown repository 'team/nobody' (NAME_UNKNOWN)" in failed["error"], failed["error"]
        held = engine_adapters(engine_port)["sql"]

        # The tag moves: the loaded adapter keeps the files it verified; the new push is a new version,
        # loaded once the set pins its digest (a GitOps commit), and reported as such.
        moved = _push(write_peft_adapter(tmp_path / "v2", rank=16, seed=2), tag)
        assert moved != first
        cfg.write(adapter_set([{"name": "sql", "source": tag}, {"name": "pinned", "source": f"{tag}@{moved}"}]))
        sidecar.wait_phase("pinned", "Loaded", rank=16, resolvedRevision=moved)
        assert sidecar.adapters()["sql"]["resolvedRevision"] == first
        assert engine_adapters(engine_port)["sql"] == held
    finally:
        sidecar.proc.close()
