"""A tiny real Llama model and real PEFT adapters for it, written locally (no model hub).

Called by the real-engine tests, ``lorapool engine model|adapter`` and anything that starts
``vllm serve`` on the CPU. The model is a ``LlamaForCausalLM`` with random (seeded) weights:
it talks nonsense, but vLLM loads, batches and LoRA-patches it exactly as a real Llama.

- Weights are drawn in pure Python (``random.Random(seed)``) and saved as safetensors through
  ``lorapool_dev.testing.peft``: the same spec always gives the same bytes.
- The tokenizer is byte-level BPE without merges (256 byte tokens + special tokens), built
  with the ``tokenizers`` library. That library lives in the engine venv, so ``build_tokenizer``
  runs there (``ensure_tiny_model`` does that for you); no training, so it is deterministic.
- The model is cached in ``$LORAPOOL_CACHE/engine/tiny-llama-<hash>/`` (the hash covers the
  spec and ``BUILD_VERSION``), written to a temporary directory and renamed into place.

Adapters (``write_tiny_adapter``) are real PEFT directories whose tensor shapes match the
model, with finite weights large enough that an adapter's output differs from the base
model's and from another adapter's (so an in-place swap is visible). ``AdapterKind`` names the
bad ones a pool must refuse.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import lorapool
from lorapool.cache import cache_root
from lorapool_dev.engine.install import EngineInstall, require_engine
from lorapool_dev.testing.peft import normal_f32, safetensors_bytes, write_peft_adapter

BUILD_VERSION = 2  # bump when the files written change, so caches rebuild (2: bfloat16 weights)
STAMP = "BUILT.json"
LORA_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPECIAL_TOKENS: tuple[str, ...] = ("<|begin_of_text|>", "<|end_of_text|>", "<|start|>", "<|end|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
ADAPTER_STD = 0.1  # adapter weights ~N(0, 0.1), lora_alpha = 2r: changes outputs visibly


@dataclass(frozen=True)
class TinyModelSpec:
    """Dimensions of the tiny Llama (defaults: ~1.5 M parameters, 3 MB in bfloat16)."""

    num_layers: int = 2
    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    vocab_size: int = 320  # 256 byte tokens + specials + reserved tokens, a multiple of 64
    max_position_embeddings: int = 2048
    seed: int = 0
    weight_std: float = 0.05

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """Each LoRA-able linear layer's ``(out_features, in_features)``."""
        q, kv, h, i = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.hidden_size,
            self.intermediate_size,
        )
        return {
            "q_proj": (q, h),
            "k_proj": (kv, h),
            "v_proj": (kv, h),
            "o_proj": (h, q),
            "gate_proj": (i, h),
            "up_proj": (i, h),
            "down_proj": (h, i),
        }

    def key(self) -> str:
        raw = json.dumps({"spec": asdict(self), "build": BUILD_VERSION}, sort_keys=True)
        return hashlib.sha256(raw.encode()).hexdigest()[:12]


DEFAULT_SPEC = TinyModelSpec()
# A different architecture whose adapters do not fit the tiny model ("wrong base model").
OTHER_SPEC = TinyModelSpec(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)


class AdapterKind(enum.StrEnum):
    """What ``write_tiny_adapter`` writes; everything but GOOD must be refused by a pool."""

    GOOD = "good"
    DORA = "dora"  # use_dora: vLLM does not serve DoRA
    WRONG_BASE = "wrong-base"  # trained for OTHER_SPEC: tensor shapes do not fit
    CORRUPT = "corrupt"  # adapter_model.safetensors cut short


def model_dir(spec: TinyModelSpec = DEFAULT_SPEC, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "engine" / f"tiny-llama-{spec.key()}"


def llama_config(spec: TinyModelSpec) -> dict[str, object]:
    """The model's config.json. Pure."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 256,
        "eos_token_id": 257,
        "torch_dtype": "bfloat16",  # what vLLM's CPU backend runs; float32 weights were cast with a warning each
    }


def model_weights(spec: TinyModelSpec) -> bytes:
    """The safetensors bytes of every weight, drawn from ``spec.seed``. Pure (deterministic)."""
    rng = random.Random(spec.seed)
    tensors: dict[str, tuple[tuple[int, ...], bytes]] = {}

    def normal(name: str, *shape: int) -> None:
        count = 1
        for dim in shape:
            count *= dim
        tensors[name] = (shape, _bf16(normal_f32(rng, count, spec.weight_std)))

    def ones(name: str, size: int) -> None:
        tensors[name] = ((size,), _bf16(normal_f32(rng, size, 0.0, mean=1.0)))

    normal("model.embed_tokens.weight", spec.vocab_size, spec.hidden_size)
    shapes = spec.module_shapes()
    for layer in range(spec.num_layers):
        prefix = f"model.layers.{layer}"
        ones(f"{prefix}.input_layernorm.weight", spec.hidden_size)
        ones(f"{prefix}.post_attention_layernorm.weight", spec.hidden_size)
        for module, (out_features, in_features) in shapes.items():
            group = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            normal(f"{prefix}.{group}.{module}.weight", out_features, in_features)
    ones("model.norm.weight", spec.hidden_size)
    normal("lm_head.weight", spec.vocab_size, spec.hidden_size)
    return safetensors_bytes(dict(tensors), dtype="BF16")


def _bf16(f32: bytes) -> bytes:
    """Little-endian float32 values truncated to bfloat16 (their high 16 bits)."""
    return memoryview(f32).cast("H")[1::2].tobytes()


def tokenizer_files(spec: TinyModelSpec) -> dict[str, str]:
    """tokenizer_config.json, special_tokens_map.json and chat_template.jinja. Pure."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "pad_token": SPECIAL_TOKENS[1],
        "model_max_length": spec.max_position_embeddings,
        "add_bos_token": True,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special = {"bos_token": SPECIAL_TOKENS[0], "eos_token": SPECIAL_TOKENS[1], "pad_token": SPECIAL_TOKENS[1]}
    return {
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
        "chat_template.jinja": CHAT_TEMPLATE,
        "generation_config.json": json.dumps({"bos_token_id": 256, "eos_token_id": 257}) + "\n",
    }


def build_tokenizer(out_dir: str, vocab_size: int) -> None:
    """Write tokenizer.json: byte-level BPE, no merges. Runs where ``tokenizers`` is installed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    reserved = [f"<|reserved_{i}|>" for i in range(vocab_size - len(alphabet) - len(SPECIAL_TOKENS))]
    tokenizer.add_special_tokens([*SPECIAL_TOKENS, *reserved])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL_TOKENS[0]} $A", special_tokens=[(SPECIAL_TOKENS[0], len(alphabet))]
    )
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, expected {vocab_size}")
    tokenizer.save(str(Path(out_dir) / "tokenizer.json"))


def ensure_tiny_model(
    spec: TinyModelSpec = DEFAULT_SPEC, *, engine: EngineInstall | None = None, cache: Path | None = None
) -> Path:
    """The tiny model's directory, built on first use (needs the engine venv for the tokenizer)."""
    target = model_dir(spec, cache)
    if (target / STAMP).is_file():
        return target
    install = engine or require_engine(cache=cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        (tmp / "config.json").write_text(json.dumps(llama_config(spec), indent=2) + "\n")
        (tmp / "model.safetensors").write_bytes(model_weights(spec))
        for name, text in tokenizer_files(spec).items():
            (tmp / name).write_text(text)
        package_parent = str(Path(lorapool.__file__).resolve().parents[1])
        code = "import sys; from lorapool_dev.engine.tinymodel import build_tokenizer; build_tokenizer(sys.argv[1], int(sys.argv[2]))"
        env = {**os.environ, "PYTHONPATH": package_parent}
        subprocess.run(
            [str(install.python), "-c", code, str(tmp), str(spec.vocab_size)],
            env=env, check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        (tmp / STAMP).write_text(json.dumps({"spec": asdict(spec), "build": BUILD_VERSION}, indent=2) + "\n")
        try:
            tmp.rename(target)
        except OSError:
            if not (target / STAMP).is_file():  # lost a race to an identical build: fine
                raise
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building the tiny model's tokenizer failed:\n{exc.stderr[-3000:]}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_tiny_adapter(
    out_dir: Path,
    *,
    rank: int = 8,
    seed: int = 0,
    kind: AdapterKind = AdapterKind.GOOD,
    spec: TinyModelSpec = DEFAULT_SPEC,
    base_model: str = "tiny-llama",
) -> Path:
    """Write a PEFT adapter for the tiny model into ``out_dir``; different seeds give different outputs."""
    dims = OTHER_SPEC if kind is AdapterKind.WRONG_BASE else spec
    extra: dict[str, object] = {"lora_alpha": 2 * rank}
    if kind is AdapterKind.DORA:
        extra["use_dora"] = True
    if kind is AdapterKind.WRONG_BASE:
        base_model = "other-tiny-llama"
    write_peft_adapter(
        out_dir,
        rank=rank,
        base_model=base_model,
        target_modules=LORA_MODULES,
        hidden_size=dims.hidden_size,
        num_layers=dims.num_layers,
        seed=seed,
        extra_config=extra,
        module_shapes=dims.module_shapes(),
        std=ADAPTER_STD,
    )
    if kind is AdapterKind.CORRUPT:
        tensors = out_dir / "adapter_model.safetensors"
        data = tensors.read_bytes()
        tensors.write_bytes(data[: len(data) // 2])
    return out_dir
