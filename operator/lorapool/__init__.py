"""lorapool: serve many LoRA adapters on shared vLLM base-model replicas on Kubernetes."""

__version__ = "0.1.0"
