"""A plan as text a platform engineer reads: each flag, its reason, where the memory goes. Pure."""

from __future__ import annotations

from lorapool.api.models import LoRAPool
from lorapool.plan.planner import Plan


def _gb(n: int) -> str:
    return f"{n / 1e9:6.1f} GB"


def _why(plan: Plan, key: str, value: int) -> str:
    """The reason without its leading "<value>: ", which the table already shows."""
    reason = plan.reasons[key]
    return reason.removeprefix(f"{value}: ")


def _concurrency(plan: Plan) -> list[str]:
    """The estimate behind auto --max-loras, and what the sizing loop will replace it with."""
    c = plan.concurrency
    if c is None:
        return []
    return [
        "",
        f"Slot concurrency (estimate, before traffic): {c.sequences} sequences in flight "
        f"(min of vllm.maxNumSeqs and KV cache / {c.sequence_tokens} tokens) spread evenly over "
        f"{c.n_adapters} adapter(s) use {c.distinct} distinct adapters at once.",
        "  Even spreading is the most a batch can need; skewed traffic needs fewer. The operator measures the "
        "real concurrency and writes status.recommendation (kubectl describe lp); spec.lora.tuning.apply applies it.",
    ]


def explain_plan(pool: LoRAPool, plan: Plan, n_adapters: int) -> str:
    spec = pool.spec
    m = plan.memory
    seqs = m.kv_cache_tokens // plan.max_model_len
    gained_tokens = m.kv_cache_tokens - m.naive_kv_cache_tokens
    lines = [
        f"LoRAPool {pool.metadata.namespace}/{pool.metadata.name}: {spec.base_model.name}",
        f"  {spec.replicas} replica(s) on {plan.gpu} x{plan.tensor_parallel_size}, {n_adapters} adapter(s), "
        f"model dims: {plan.model}",
        "",
        "vLLM flags",
        f"  --max-lora-rank {plan.max_lora_rank:<6} {_why(plan, 'maxLoraRank', plan.max_lora_rank)}",
        f"  --max-loras     {plan.max_loras:<6} {_why(plan, 'maxLoras', plan.max_loras)}",
        f"  --max-cpu-loras {plan.max_cpu_loras:<6} {_why(plan, 'maxCpuLoras', plan.max_cpu_loras)}",
        f"  --max-model-len {plan.max_model_len:<6} "
        + ("set in spec.vllm.maxModelLen" if spec.vllm.max_model_len else "model context, at most 8192"),
        *_concurrency(plan),
        "",
        f"GPU memory, per GPU ({plan.gpu}: {m.gpu_bytes / 1e9:.1f} GB x gpuMemoryUtilization "
        f"{spec.vllm.gpu_memory_utilization} = {m.usable_bytes / 1e9:.1f} GB)",
        f"  weights      {_gb(m.weights_bytes)}",
        f"  LoRA buffers {_gb(m.lora_bytes)}   {plan.max_loras} slot(s) x rank {plan.max_lora_rank}",
        f"  reserve      {_gb(m.reserve_bytes)}   CUDA context, graphs, activations (estimate)",
        f"  KV cache     {_gb(m.kv_cache_bytes)}   {m.kv_cache_tokens:,} tokens = {seqs} x {plan.max_model_len}-token sequences",
        "",
    ]
    if m.naive_kv_cache_tokens <= 0:
        lines.append(
            f"A naive --max-lora-rank {m.naive_rank} would need {m.naive_lora_bytes / 1e9:.1f} GB of LoRA buffers "
            "and leave no KV cache: vLLM would fail to start (CUDA OOM)."
        )
    elif plan.max_lora_rank >= m.naive_rank:
        lines.append(f"--max-lora-rank is already {plan.max_lora_rank}: the adapters need it.")
    else:
        lines.append(
            f"A naive --max-lora-rank {m.naive_rank} would cost {m.naive_lora_bytes / 1e9:.1f} GB of LoRA buffers "
            f"and leave {m.naive_kv_cache_tokens:,} KV tokens; rank {plan.max_lora_rank} gives back "
            f"{(m.naive_lora_bytes - m.lora_bytes) / 1e9:.1f} GB = {gained_tokens:,} tokens of KV cache."
        )
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)
