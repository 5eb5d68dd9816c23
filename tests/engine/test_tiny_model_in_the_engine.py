"""The tiny model as the engine's own libraries see it (needs `lorapool engine install`)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lorapool_dev.engine.fixtures import engine_or_skip, started
from lorapool_dev.engine.server import ServeConfig, crash_engine, descendants
from lorapool_dev.engine.tinymodel import DEFAULT_SPEC, SPECIAL_TOKENS, ensure_tiny_model
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.engine

CHECK = """
import json, sys
from transformers import AutoConfig, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
ids = tok("Hello, wörld!")["input_ids"]
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
cfg = AutoConfig.from_pretrained(path)
print(json.dumps({"ids": ids, "text": tok.decode(ids, skip_special_tokens=True), "chat": chat,
                  "vocab": len(tok), "arch": cfg.architectures, "eos": tok.eos_token}))
"""


def test_tokenizer_config_and_chat_template_load_with_transformers() -> None:
    install = engine_or_skip()
    path = ensure_tiny_model(engine=install)
    started = time.monotonic()
    assert ensure_tiny_model(engine=install) == path  # cached: no rebuild
    assert time.monotonic() - started < 1
    result = subprocess.run(
        [str(install.python), "-c", CHECK, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["text"] == "Hello, wörld!"  # byte-level: any text round-trips
    assert seen["ids"][0] == 256  # <|begin_of_text|>
    assert seen["vocab"] == DEFAULT_SPEC.vocab_size
    assert seen["arch"] == ["LlamaForCausalLM"]
    assert seen["eos"] == SPECIAL_TOKENS[1]
    assert seen["chat"] == "<|begin_of_text|><|start|>user\nhi<|end|>\n<|start|>assistant\n"


def test_a_crashed_engine_leaves_no_process_behind_and_restarts_on_the_same_port() -> None:
    install = engine_or_skip()
    cfg = ServeConfig(model=str(ensure_tiny_model(engine=install)), port=free_port())
    with started("vllm", cfg, install=install) as proc:
        tree = [proc.pid, *descendants(proc.pid)]
        assert len(tree) >= 3  # API server, engine core, worker
        crash_engine(proc)
        wait_until("every engine process to be gone", lambda: not [p for p in tree if _alive(p)], timeout_s=10)
    with started("vllm", cfg, install=install):  # the port is free again
        assert (
            json.loads(urllib.request.urlopen(f"{cfg.url}/v1/models", timeout=10).read())["data"][0]["id"]
            == "tiny-llama"
        )


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
