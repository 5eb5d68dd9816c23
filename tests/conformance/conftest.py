"""One engine per kind for the whole conformance session: real vLLM (CPU) and the simulator.

The ``engine`` fixture is session-scoped and parametrized over ``ENGINE_KINDS``, so pytest runs
every case against vLLM with one vLLM process, stops it, then runs them against the simulator:
never more than one engine at a time. Both start from the same ``ServeConfig`` (same flags).

Which vLLM release each row ran is recorded, not assumed: the fixture reads the engine's
``GET /version``, requires the real engine to be ``CPU_TIER``'s family (a changed CPU build
cannot move the reference silently), runs the simulator as that release (``--vllm-version``),
and the session's junit XML records it per engine kind (testsuite properties
``vllm_version.vllm`` and ``vllm_version.sim``; every row's id starts with its kind).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from lorapool.api.vllm_versions import CPU_TIER, family_name, release_of
from lorapool_dev.engine.fixtures import engine_or_skip, started
from lorapool_dev.engine.server import ENGINE_KINDS, EngineKind, ServeConfig
from lorapool_dev.engine.tinymodel import (
    ADAPTER_STD,
    DEFAULT_SPEC,
    AdapterKind,
    ensure_tiny_model,
    llama_config,
    write_tiny_adapter,
)
from lorapool_dev.testing import http
from lorapool_dev.testing.http import Response
from lorapool_dev.testing.peft import Misfit, write_misfit_adapter
from lorapool_dev.testing.processes import free_port

MAX_LORAS = 1
MAX_LORA_RANK = 16
MAX_CPU_LORAS = 2
MAX_MODEL_LEN = 512
# Both engines' KV block size (vLLM's CPU build defaults to 128, the simulator to the GPU's 16): the
# prefix-cache row counts hits in whole blocks, so the two must agree.
BLOCK_SIZE = 32
BASE = "tiny-llama"

# name -> (rank, seed, kind); "missing" is a path that does not exist.
ADAPTERS: dict[str, tuple[int, int, AdapterKind]] = {
    "good-a": (8, 1, AdapterKind.GOOD),
    "good-b": (8, 2, AdapterKind.GOOD),
    "good-c": (16, 3, AdapterKind.GOOD),
    "static": (8, 5, AdapterKind.GOOD),
    "rank-64": (64, 6, AdapterKind.GOOD),
    "dora": (8, 7, AdapterKind.DORA),
    "corrupt": (8, 8, AdapterKind.CORRUPT),
    "wrong-base": (8, 9, AdapterKind.WRONG_BASE),
}
# Adapters that do not fit the tiny model (besides "wrong-base", made for another shape): what vLLM
# does with each is a row of the table; lorapool.sources.verify refuses them all.
MISFITS: dict[str, Misfit] = {
    "other-prefix": Misfit.OTHER_PREFIX,
    "too-many-layers": Misfit.TOO_MANY_LAYERS,
    "rank-mismatch": Misfit.RANK_MISMATCH,
    "module-base-lacks": Misfit.MODULE_BASE_LACKS,
    "no-lora-tensors": Misfit.NO_LORA_TENSORS,
}


@dataclass
class Engine:
    """A running engine of one kind, with the adapter directories the cases use."""

    kind: EngineKind
    cfg: ServeConfig
    paths: dict[str, str]
    output: Any = field(repr=False, default=None)
    version: str = ""  # its GET /version answer

    @property
    def url(self) -> str:
        return self.cfg.url

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json", timeout_s: float = 60
    ) -> Response:
        return http.request(f"{self.url}{path}", method, body, content_type=content_type, timeout_s=timeout_s)

    def post(self, path: str, body: Any) -> Response:
        return self.request("POST", path, body)


@pytest.fixture(scope="session")
def adapter_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    paths = {
        name: str(write_tiny_adapter(root / name, rank=rank, seed=seed, kind=kind))
        for name, (rank, seed, kind) in ADAPTERS.items()
    }
    paths["missing"] = str(root / "missing")
    # embed_tokens/lm_head in modules_to_save: PEFT's way to train new tokens
    saved = write_tiny_adapter(root / "modules-to-save", rank=8, seed=10)
    config = json.loads((saved / "adapter_config.json").read_text())
    (saved / "adapter_config.json").write_text(json.dumps({**config, "modules_to_save": ["lm_head"]}))
    paths["modules-to-save"] = str(saved)
    for seed, (name, misfit) in enumerate(MISFITS.items(), start=20):
        shapes, layers = DEFAULT_SPEC.module_shapes(), DEFAULT_SPEC.num_layers
        written = write_misfit_adapter(
            root / name, misfit, module_shapes=shapes, num_layers=layers, seed=seed, std=ADAPTER_STD, base_model=BASE
        )
        paths[name] = str(written)
    return paths


@pytest.fixture(scope="session")
def sim_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The simulator's --model: a directory with the tiny model's config.json, so it verifies adapters
    against the shape vLLM serves (it reads no weights), whether or not the engine is installed."""
    root = tmp_path_factory.mktemp("sim-model")
    (root / "config.json").write_text(json.dumps(llama_config(DEFAULT_SPEC)))
    return str(root)


def serve_config(model: str, paths: dict[str, str]) -> ServeConfig:
    return ServeConfig(
        model=model,
        port=free_port(),
        served_model_name=BASE,
        max_loras=MAX_LORAS,
        max_lora_rank=MAX_LORA_RANK,
        max_cpu_loras=MAX_CPU_LORAS,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        lora_modules=(("static", paths["static"]),),
        vllm_version=CPU_TIER,  # the simulator runs as the release the real engine is
    )


@pytest.fixture(
    scope="session", params=[pytest.param(k, marks=pytest.mark.engine) if k == "vllm" else k for k in ENGINE_KINDS]
)
def engine(
    request: pytest.FixtureRequest,
    adapter_paths: dict[str, str],
    sim_model: str,
    record_testsuite_property: Callable[[str, object], None],
) -> Iterator[Engine]:
    kind: EngineKind = request.param
    if kind == "vllm":
        install = engine_or_skip()
        cfg = serve_config(str(ensure_tiny_model(engine=install)), adapter_paths)
        with started("vllm", cfg, install=install) as proc:
            version = reference_version(cfg)
            record_testsuite_property("vllm_version.vllm", version)
            yield Engine(kind, cfg, adapter_paths, proc, version=version)
    else:
        # The simulator reads no weights: the model path is the base card's root and its shape.
        cfg = serve_config(sim_model, adapter_paths)
        with started("sim", cfg) as proc:
            version = reference_version(cfg)
            record_testsuite_property("vllm_version.sim", version)
            yield Engine(kind, cfg, adapter_paths, proc, version=version)


def reference_version(cfg: ServeConfig) -> str:
    """The engine's ``/version``; it must be CPU_TIER's release, the one the table compares against."""
    version = str(http.request(f"{cfg.url}/version", "GET").json()["version"])
    assert release_of(version) == release_of(CPU_TIER), (
        f"the engine answers /version {version!r}, not vLLM {family_name(CPU_TIER)} (api.vllm_versions.CPU_TIER): "
        "update CPU_TIER and the CPU engine together, and re-run the table"
    )
    return version
