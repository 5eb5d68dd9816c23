"""The sidecar verifies every download against the base shape the operator renders (LORAPOOL_BASE_SHAPE):
real sidecar and simulator processes, real PEFT files; a misfit ends Failed with its reason, never loaded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sidecar_procs import BASE_MODEL, NOT_YET, ConfigMapDir, adapter_set, engine_adapters, metric_samples, start_sidecar

from lorapool.sources.verify import BaseShape
from lorapool_dev.engine.tinymodel import DEFAULT_SPEC, llama_config, write_tiny_adapter
from lorapool_dev.testing.components import LORAPOOL
from lorapool_dev.testing.peft import Misfit, write_misfit_adapter
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.slow

TINY = BaseShape.from_config(llama_config(DEFAULT_SPEC), name="tiny-llama")

# misfit -> words its Failed reason holds (tensor and expected shape or layout)
EXPECTED = {
    Misfit.OTHER_SHAPE: "tiny-llama expects [8, 512] (r x intermediate_size 512)",
    Misfit.OTHER_PREFIX: "names module 'layers.0.mlp.down_proj', which is not in the base",
    Misfit.TOO_MANY_LAYERS: "is for layer 2, but tiny-llama has 2 layers",
    Misfit.RANK_MISMATCH: "has rank 16 (shape [16, 512]), but adapter_config.json says r=8",
    Misfit.MODULE_BASE_LACKS: "the base has no module 'c_attn'",
    Misfit.NO_LORA_TENSORS: "holds no LoRA tensors",
}


def test_misfits_end_failed_with_the_reason_and_never_reach_the_engine(
    tmp_path: Path, sim: RunningProcess, engine_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = write_tiny_adapter(tmp_path / "src" / "good", rank=8, base_model=BASE_MODEL)
    entries = [{"name": "good", "source": f"file://{good}"}]
    for kind in EXPECTED:
        path = write_misfit_adapter(
            tmp_path / "src" / kind.value,
            kind,
            module_shapes=DEFAULT_SPEC.module_shapes(),
            num_layers=2,
            base_model=BASE_MODEL,
        )
        entries.append({"name": kind.value, "source": f"file://{path}"})
    config = ConfigMapDir(tmp_path / "cfg")
    config.write(adapter_set(entries))
    monkeypatch.setenv("LORAPOOL_BASE_SHAPE", TINY.to_json())  # as the operator renders it
    sidecar = start_sidecar(config.path, engine_port, tmp_path / "adapters")
    try:
        sidecar.wait_phase("good", "Loaded")
        for kind, words in EXPECTED.items():
            failed = sidecar.wait_phase(kind.value, "Failed")
            assert failed["error"].startswith(f"adapter {kind.value!r}: ") and words in failed["error"], failed
        assert set(engine_adapters(engine_port)) == {"good"}
        assert not (tmp_path / "adapters" / "other-shape").exists()  # nothing half-written in the store
        failures = wait_until(
            "the failures counted",
            lambda: metric_samples(sidecar.metrics(), "lorapool_sidecar_failures_total").get('reason="invalid"'),
            10,
            retry_on=NOT_YET,
        )
        assert failures >= len(EXPECTED)
    finally:
        sidecar.proc.close()


def test_without_a_base_shape_an_adapter_for_another_shape_is_served(
    tmp_path: Path, sim: RunningProcess, engine_port: int
) -> None:
    """No LORAPOOL_BASE_SHAPE (a base of unknown dims): config and weights only. Module names are not
    judged either (the base's layout is unknown): another prefix is vLLM's to take, and it does."""
    assert "LORAPOOL_BASE_SHAPE" not in os.environ
    other = write_misfit_adapter(
        tmp_path / "other",
        Misfit.OTHER_SHAPE,
        module_shapes=DEFAULT_SPEC.module_shapes(),
        num_layers=2,
        base_model=BASE_MODEL,
    )
    prefix = write_misfit_adapter(
        tmp_path / "prefix",
        Misfit.OTHER_PREFIX,
        module_shapes=DEFAULT_SPEC.module_shapes(),
        num_layers=2,
        base_model=BASE_MODEL,
    )
    config = ConfigMapDir(tmp_path / "cfg")
    config.write(
        adapter_set([{"name": "other", "source": f"file://{other}"}, {"name": "p", "source": f"file://{prefix}"}])
    )
    sidecar = start_sidecar(config.path, engine_port, tmp_path / "adapters")
    try:
        sidecar.wait_phase("other", "Loaded")
        sidecar.wait_phase("p", "Loaded")
    finally:
        sidecar.proc.close()


@pytest.mark.parametrize(
    ("value", "words"),
    [("{not json", "base shape is not valid JSON"), ('{"hidden_size": 0}', "must be a positive integer")],
)
def test_a_bad_base_shape_stops_the_sidecar_saying_why(tmp_path: Path, value: str, words: str) -> None:
    argv = [*LORAPOOL, "sidecar", "--config", str(tmp_path / "a.json"), "--engine"]
    argv += ["http://127.0.0.1:9", "--adapter-dir", str(tmp_path / "adapters"), "--base-shape", value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "--base-shape / $LORAPOOL_BASE_SHAPE" in done.stderr and words in done.stderr, done.stderr
