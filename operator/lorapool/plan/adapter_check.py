"""Does a LoRA adapter's weights fit the base model? Pure: tensor names, dtypes, shapes and config in,
a ``Verification`` or an ``AdapterError`` out.

Why: vLLM loads an adapter whose tensor names match no module of the base and serves base-model
output (vllm#34186), and copies an adapter made for a smaller model of the same family into its
buffers without a word (tests/conformance measures both). So every source is checked here before
any load: by the sidecar after a download, by the simulator (``lorapool.sim.adapters``) and by
``lorapool adapter push`` offline. ``lorapool.sources.verify`` reads the files and calls this.

Names are read as vLLM 0.32's loader reads them: ``vllm/lora/utils.py: parse_fine_tuned_lora_name``
(drop ``base_model.model.``, then ``<module>.lora_A|lora_B.weight`` or
``<module>.lora_embedding_A|B``), ``vllm/lora/lora_model.py: LoRAModel.from_local_checkpoint`` (skips
``*.embed_tokens|lm_head.base_layer.weight``; refuses a module whose last part the model has no LoRA
layer for) and ``from_lora_tensors`` (an embedding's ``lora_embedding_A`` is ``[r, vocab]``). A module
is then found by its full name in the model: vLLM's Llama-style decoders (Llama, Mistral, Qwen2: every
model ``lorapool.plan.dims`` knows) name them ``model.layers.<i>.self_attn.{q,k,v,o}_proj``,
``model.layers.<i>.mlp.{gate,up,down}_proj``, ``model.embed_tokens`` and ``lm_head``; any other
full name matches nothing and vLLM ignores the tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from lorapool.api.peft import AdapterConfig
from lorapool.errors import AdapterError
from lorapool.plan.dims import ModelDims

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LORA_MODULES = frozenset({*ATTENTION, *MLP, "embed_tokens", "lm_head"})
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
_PEFT_PREFIX = "base_model.model."
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)$")
_TOP = {"model.embed_tokens": "embed_tokens", "lm_head": "lm_head"}
_SKIPPED = (".embed_tokens.base_layer.weight", ".lm_head.base_layer.weight")  # is_base_embedding_weights
_SHOWN = 3  # refusals quoted in one message; the rest are counted
# config.json model types whose decoders name their LoRA modules as Llama's (vLLM's packed_modules_mapping
# and the HF modeling code agree: q/k/v/o_proj under self_attn, gate/up/down_proj under mlp).
LLAMA_STYLE = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "granite"})


@dataclass(frozen=True)
class BaseShape:
    """The base model's dimensions an adapter's tensors must fit (names as in HF config.json)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    name: str = "the base model"
    # Its modules are named as a Llama-style decoder's (model.layers.<i>.self_attn.q_proj, mlp.gate_proj,
    # ...): true of the planner's table and of config.json's LLAMA_STYLE model types. Only then are
    # module names refused for not being the base's; another layout (fused qkv_proj, ...) is not judged.
    llama_layout: bool = True

    @classmethod
    def from_config(cls, config_json: Mapping[str, Any], *, name: str | None = None) -> BaseShape:
        """From a HF ``config.json`` dict (a multimodal one's ``text_config``); AdapterError names a missing key."""
        config: Mapping[str, Any] = config_json
        if "hidden_size" not in config and isinstance(config_json.get("text_config"), Mapping):
            config = config_json["text_config"]
        label = name or str(config_json.get("_name_or_path") or "config.json")

        def number(key: str, default: int | None = None) -> int:
            value = config.get(key)
            if value is None:  # absent or null: HF's default, if it has one
                value = default
            if value is None:
                raise AdapterError(f"{label}: config.json has no {key!r}; give the base model's full config.json")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AdapterError(f"{label}: config.json {key}={value!r} must be a positive integer")
            return value

        hidden, heads = number("hidden_size"), number("num_attention_heads")
        model_type = config.get("model_type") or config_json.get("model_type")
        return cls(
            hidden_size=hidden,
            intermediate_size=number("intermediate_size"),
            num_layers=number("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=number("num_key_value_heads", heads),
            head_dim=number("head_dim", hidden // heads or None),
            vocab_size=number("vocab_size"),
            name=label,
            llama_layout=model_type in LLAMA_STYLE,
        )

    @classmethod
    def from_dims(cls, dims: ModelDims) -> BaseShape:
        """From the planner's dimensions (``spec.baseModel.architecture``, config.json or its table)."""
        return cls(
            hidden_size=dims.hidden_size,
            intermediate_size=dims.intermediate_size,
            num_layers=dims.num_layers,
            num_attention_heads=dims.num_attention_heads,
            num_key_value_heads=dims.num_key_value_heads,
            head_dim=dims.head_dim,
            vocab_size=dims.vocab_size,
            name=dims.key,
        )

    def to_json(self) -> str:
        """One line of JSON, keys sorted: the same shape always renders the same pod template."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> BaseShape:
        """The inverse of ``to_json``; AdapterError says what is wrong (it comes from a flag or env var)."""
        try:
            raw = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AdapterError(f"base shape is not valid JSON ({exc}); it is rendered by the operator") from exc
        if not isinstance(raw, dict):
            raise AdapterError("base shape must be a JSON object; it is rendered by the operator")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(raw) - known):
            raise AdapterError(f"base shape has unknown keys {unknown}; expected {sorted(known)}")
        layout = raw.get("llama_layout", True)
        if not isinstance(layout, bool):
            raise AdapterError(
                f"base shape llama_layout={layout!r} must be true or false; it is rendered by the operator"
            )
        numbers = {}
        for key in sorted(known - {"name", "llama_layout"}):
            value = raw.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AdapterError(
                    f"base shape {key}={value!r} must be a positive integer; it is rendered by the operator"
                )
            numbers[key] = value
        return cls(**numbers, name=str(raw.get("name") or "the base model"), llama_layout=layout)

    def describe(self) -> str:
        return (
            f"{self.name} (hidden {self.hidden_size}, {self.num_layers} layers, {self.num_attention_heads} heads x "
            f"{self.head_dim}, {self.num_key_value_heads} kv heads, intermediate {self.intermediate_size}, "
            f"vocab {self.vocab_size})"
        )

    def features(self, module: str) -> tuple[tuple[int, str], tuple[int, str]]:
        """``module``'s (out, in) features, each with what it is made of (for the refusal's words)."""
        h, q, kv = (
            (self.hidden_size, "hidden_size"),
            (self.num_attention_heads * self.head_dim, "num_attention_heads x head_dim"),
            (self.num_key_value_heads * self.head_dim, "num_key_value_heads x head_dim"),
        )
        i, v = (self.intermediate_size, "intermediate_size"), (self.vocab_size, "vocab_size")
        table = {
            "q_proj": (q, h),
            "k_proj": (kv, h),
            "v_proj": (kv, h),
            "o_proj": (h, q),
            "gate_proj": (i, h),
            "up_proj": (i, h),
            "down_proj": (h, i),
            "lm_head": (v, h),
            "embed_tokens": (h, v),  # lora_embedding_A is [r, vocab], lora_embedding_B [hidden, r]
        }
        return table[module]


@dataclass(frozen=True)
class Tensor:
    """One safetensors header entry: its dtype and shape (the bytes are never read)."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LoraName:
    """A tensor name as vLLM reads it: ``module`` is the model's module name it is matched against."""

    tensor: str
    module: str  # e.g. model.layers.0.self_attn.q_proj
    leaf: str  # its last part, e.g. q_proj
    is_a: bool  # lora_A / lora_embedding_A (else B)
    layer: int | None  # None for embed_tokens / lm_head and for names that match no module
    known: bool  # the module exists in a Llama-style decoder (layer bounds aside)


@dataclass(frozen=True)
class Verification:
    """What was checked, for ``lorapool adapter push`` and logs."""

    checked: str  # "weights against <base>" | "config and weights only, no base shape" | ...
    tensors: int
    modules: tuple[str, ...]  # target modules found in the weights, sorted
    layers: int  # decoder layers the adapter touches
    rank: int  # the largest rank in the weights

    def describe(self) -> str:
        return (
            f"verified {self.checked}: {self.tensors} LoRA tensors, modules {', '.join(self.modules)}, "
            f"{self.layers} layers, rank {self.rank}"
        )


def tensors_from_header(header: Mapping[str, Any], *, where: str) -> dict[str, Tensor]:
    """The tensors of a parsed safetensors header; AdapterError for an entry without dtype and shape."""
    tensors: dict[str, Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype") if isinstance(entry, Mapping) else None
        shape = entry.get("shape") if isinstance(entry, Mapping) else None
        if not isinstance(dtype, str) or not (
            isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        ):
            raise AdapterError(f"{where}: tensor {name!r} has no dtype and shape in the header; re-save the adapter")
        tensors[name] = Tensor(dtype, tuple(shape))
    return tensors


def parse_lora_name(tensor: str) -> LoraName | str | None:
    """``tensor`` read as vLLM's ``parse_fine_tuned_lora_name`` reads it: a LoraName, None for a tensor
    vLLM skips (a base layer saved beside the LoRA), or the reason vLLM refuses the name."""
    if tensor.endswith(_SKIPPED):
        return None
    name = tensor.removeprefix(_PEFT_PREFIX)
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        module, is_a = ".".join(parts[:-2]), parts[-2] == "lora_A"
    elif len(parts) >= 2 and parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        module, is_a = ".".join(parts[:-1]), parts[-1] == "lora_embedding_A"
    else:
        return (
            f"tensor {tensor!r} is not a LoRA weight (vLLM refuses it: 'is unsupported LoRA weight'); "
            "expected <module>.lora_A.weight / .lora_B.weight, as PEFT's save_pretrained writes"
        )
    leaf = module.rsplit(".", 1)[-1]
    if (top := _TOP.get(module)) is not None:
        return LoraName(tensor, module, top, is_a, None, known=True)
    match = _LAYER.match(module)
    group = "self_attn" if leaf in ATTENTION else "mlp"
    known = bool(match and leaf in (*ATTENTION, *MLP) and match.group(2) == group)
    layer = int(match.group(1)) if match and known else None
    return LoraName(tensor, module, leaf, is_a, layer, known)


def check_adapter(
    tensors: Mapping[str, Tensor], config: AdapterConfig, base: BaseShape | None, *, where: str
) -> Verification:
    """Refuse what vLLM would refuse or silently mis-serve; the reasons name the tensor and the expected
    shape. Without ``base``: names, dtypes, A/B pairs and ranks against the config only."""
    problems: list[str] = []
    names: list[LoraName] = []
    for tensor in sorted(tensors):
        parsed = parse_lora_name(tensor)
        if isinstance(parsed, str):
            problems.append(parsed)
        elif parsed is not None:
            names.append(parsed)
    if not names and not problems:
        problems.append(
            "holds no LoRA tensors (no <module>.lora_A.weight / .lora_B.weight); vLLM would load it and serve "
            "base-model output; save the adapter with PEFT's save_pretrained"
        )
    for name in names:
        problems.extend(_name_problems(name, base))
    if not problems:
        problems.extend(_pair_problems(names, tensors))
    problems.extend(
        p for name in names if name.known for p in _shape_problems(name, tensors[name.tensor], config, base)
    )
    if problems:
        raise AdapterError(_message(where, problems, config, base))
    return _verification(names, tensors, base)


def _name_problems(name: LoraName, base: BaseShape | None) -> list[str]:
    """Modules the base lacks, names vLLM would ignore, layers past the base's. Judged only against a
    base whose module layout is known (``BaseShape.llama_layout``): without one, vLLM is the judge."""
    if base is None:
        return []
    if base.llama_layout and name.leaf not in LORA_MODULES:
        return [
            f"tensor {name.tensor!r}: the base has no module {name.leaf!r} (vLLM refuses it: 'expected target "
            f"modules in ...'); retrain with target_modules among {sorted(LORA_MODULES - {'embed_tokens'})}"
        ]
    if base.llama_layout and not name.known:
        return [
            f"tensor {name.tensor!r} names module {name.module!r}, which is not in the base; vLLM would ignore "
            f"it without a word and serve base-model output (vllm#34186); expected "
            f"'base_model.model.model.layers.<i>.{'self_attn' if name.leaf in ATTENTION else 'mlp'}.{name.leaf}"
            f".lora_A.weight' (the adapter was saved from another model class or with another prefix)"
        ]
    if name.layer is not None and name.layer >= base.num_layers:
        return [
            f"tensor {name.tensor!r} is for layer {name.layer}, but {base.name} has {base.num_layers} layers "
            f"(0..{base.num_layers - 1}); vLLM would ignore it without a word; the adapter was made for a deeper model"
        ]
    return []


def _shape_problems(name: LoraName, tensor: Tensor, config: AdapterConfig, base: BaseShape | None) -> list[str]:
    if tensor.dtype not in FLOAT_DTYPES:
        return [
            f"tensor {name.tensor!r} has dtype {tensor.dtype}; LoRA weights are floating point {sorted(FLOAT_DTYPES)}"
        ]
    if len(tensor.shape) != 2:
        return [f"tensor {name.tensor!r} has shape {list(tensor.shape)}; a LoRA weight is a matrix (2 dimensions)"]
    rank = config.rank_for(name.module)
    weight_rank = tensor.shape[0] if name.is_a else tensor.shape[1]
    if weight_rank != rank:
        expected = [rank, tensor.shape[1]] if name.is_a else [tensor.shape[0], rank]
        return [
            f"tensor {name.tensor!r} has rank {weight_rank} (shape {list(tensor.shape)}), but adapter_config.json "
            f"says r={rank} for it (r, rank_pattern): expected {expected}; vLLM would scale it by the wrong rank; "
            "re-save the adapter so config and weights agree"
        ]
    if base is None:
        return []
    (out_n, out_what), (in_n, in_what) = base.features(name.leaf)
    features, what = (in_n, in_what) if name.is_a else (out_n, out_what)
    got = tensor.shape[1] if name.is_a else tensor.shape[0]
    if got == features:
        return []
    expected = [rank, features] if name.is_a else [features, rank]
    dims = f"r x {what} {features}" if name.is_a else f"{what} {features} x r"
    return [f"tensor {name.tensor!r} has shape {list(tensor.shape)}; {base.name} expects {expected} ({dims})"]


def _pair_problems(names: Sequence[LoraName], tensors: Mapping[str, Tensor]) -> list[str]:
    """Each module needs both its A and its B: vLLM multiplies them (a missing one fails at activation)."""
    parts: dict[str, dict[bool, LoraName]] = {}
    for name in names:
        parts.setdefault(name.module, {})[name.is_a] = name
    problems: list[str] = []
    for module, pair in sorted(parts.items()):
        if len(pair) == 1:
            (only,) = pair.values()
            problems.append(
                f"tensor {only.tensor!r} has no {'lora_B' if only.is_a else 'lora_A'} beside it for {module!r}"
            )
    return problems


def _message(where: str, problems: Sequence[str], config: AdapterConfig, base: BaseShape | None) -> str:
    """The first problem of each kind (the same words but for layer numbers), at most ``_SHOWN`` kinds."""
    kinds: dict[str, str] = {}
    for problem in problems:
        kinds.setdefault(re.sub(r"\d+", "#", problem), problem)
    shown = "; ".join(list(kinds.values())[:_SHOWN])
    more = f" ({len(problems)} problems in all)" if len(problems) > min(len(kinds), _SHOWN) else ""
    trained = f" (adapter_config.json names base model {config.base_model!r})" if config.base_model else ""
    against = f" against {base.describe()}" if base is not None else ""
    return f"{where}: adapter does not fit{against}{trained}: {shown}{more}"


def _verification(names: Sequence[LoraName], tensors: Mapping[str, Tensor], base: BaseShape | None) -> Verification:
    ranks = [tensors[n.tensor].shape[0 if n.is_a else 1] for n in names]
    return Verification(
        checked=f"weights against {base.describe()}" if base is not None else "config and weights only, no base shape",
        tensors=len(names),
        modules=tuple(sorted({n.leaf for n in names})),
        layers=len({n.layer for n in names if n.layer is not None}),
        rank=max(ranks, default=0),
    )
