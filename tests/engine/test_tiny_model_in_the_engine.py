"""The tiny model as the engine's own libraries see it (needs `lorapool engine install`)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from lorapool.engine.fixtures import engine_or_skip
from lorapool.engine.tinymodel import DEFAULT_SPEC, SPECIAL_TOKENS, ensure_tiny_model

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
