"""The flag contract on vLLM's own parser: every supported release parses what we render.

The engine args of a set of pools (the README example and extremes: rank 512, tensor-parallel 4,
a 40 GB GPU, target modules and an extra flag) go through each release's ``make_arg_parser``
(the PyPI ``vllm`` wheel, ``lorapool_dev.engine.parsers``) and vLLM's ``LoRAConfig``; what the parser
read must be what the plan says. Two broken argvs prove the parser is vLLM's and strict. One
parser run per release (~13 s: ``import vllm``) serves every pool.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import pytest

from lorapool.api.vllm_versions import SUPPORTED
from lorapool_dev.engine.fixtures import parser_or_skip
from lorapool_dev.engine.parsers import parse_argvs
from tests.conftest import EXAMPLE
from tests.render.test_render import by_kind, render

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


def _pool(**spec: Any) -> dict[str, Any]:
    import yaml

    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return doc


RANK_512 = [
    {"name": "huge", "source": "hf://acme/huge", "rank": 512},
    {"name": "tiny", "source": "hf://acme/t", "rank": 8},
]
POOLS: dict[str, dict[str, Any]] = {
    "example": _pool(),
    "rank 512": _pool(adapters=RANK_512),
    "tp 4": _pool(gpu={"product": "A100-80GB", "count": 4}, adapters=RANK_512[:1]),
    "40 GB": _pool(gpu={"product": "A100-40GB", "count": 1}),
    "40 GB, rank 512, tp 2": _pool(gpu={"product": "A100-40GB", "count": 2}, adapters=RANK_512),
    "64 slots, target modules, extra flag": _pool(
        lora={"maxLoras": 64, "maxLoraRank": 16, "targetModules": ["q_proj", "v_proj"]},
        vllm={"extraArgs": ["--enable-prefix-caching"]},
    ),
}
# argv -> what vLLM's message names (the parser's own words in 0.32 and 0.34)
BROKEN = {
    "a flag vLLM does not have": (["m", "--enable-loras"], "unrecognized arguments: --enable-loras"),
    "a rank vLLM has no size for": (["m", "--enable-lora", "--max-lora-rank", "600"], "invalid choice: 600"),
    "fewer CPU than GPU slots": (
        ["m", "--enable-lora", "--max-loras", "8", "--max-cpu-loras", "4"],
        "max_cpu_loras (4) must be >= max_loras (8)",
    ),
}


def engine_args(doc: dict[str, Any]) -> list[str]:
    name = doc["metadata"]["name"]
    deployment = by_kind(render(copy.deepcopy(doc)), "Deployment", f"{name}-engine")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["vllm", "serve"], container["command"]
    return list(container["args"])


@cache
def parsed(version: str) -> tuple[dict[str, Any], ...]:
    """Every pool's args and every broken argv through ``version``'s parser, in one run."""
    venv = parser_or_skip(version)
    return tuple(parse_argvs(venv, [*(engine_args(d) for d in POOLS.values()), *(argv for argv, _ in BROKEN.values())]))


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("pool", POOLS)
def test_the_release_parses_what_we_render(version: str, pool: str) -> None:
    answer = parsed(version)[list(POOLS).index(pool)]
    assert "error" not in answer, f"vLLM {version} refused {pool}: {answer['error']}"
    got, args = answer["lora"], engine_args(POOLS[pool])
    assert got["model_tag"] == args[0] and got["enable_lora"] is True
    assert (got["max_loras"], got["max_lora_rank"], got["max_cpu_loras"]) == (
        int(flag(args, "--max-loras")), int(flag(args, "--max-lora-rank")), int(flag(args, "--max-cpu-loras"))
    )  # fmt: skip
    assert got["tensor_parallel_size"] == int(flag(args, "--tensor-parallel-size"))
    assert (got["port"], got["host"], got["lora_dtype"]) == (8000, "0.0.0.0", flag(args, "--lora-dtype"))
    assert got["gpu_memory_utilization"] == float(flag(args, "--gpu-memory-utilization"))
    assert got["max_num_seqs"] == int(flag(args, "--max-num-seqs"))


def test_the_extremes_reach_the_parser() -> None:
    """The table covers what it claims: rank 512, tp 4, a 40 GB GPU, target modules."""
    assert flag(engine_args(POOLS["rank 512"]), "--max-lora-rank") == "512"
    assert flag(engine_args(POOLS["tp 4"]), "--tensor-parallel-size") == "4"
    assert "A100-40GB" in str(POOLS["40 GB"]["spec"]["gpu"])
    args = engine_args(POOLS["64 slots, target modules, extra flag"])
    assert flag(args, "--max-loras") == "64" and "--enable-prefix-caching" in args


@pytest.mark.parametrize("version", SUPPORTED)
def test_target_modules_and_extra_flags_are_read(version: str) -> None:
    got = parsed(version)[list(POOLS).index("64 slots, target modules, extra flag")]["lora"]
    assert got["lora_target_modules"] == ["q_proj", "v_proj"] and got["enable_prefix_caching"] is True


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("case", BROKEN)
def test_the_release_refuses_broken_flags(version: str, case: str) -> None:
    argv, message = BROKEN[case]
    answer = parsed(version)[len(POOLS) + list(BROKEN).index(case)]
    assert message in answer.get("error", ""), f"vLLM {version} on {argv}: {answer}"
