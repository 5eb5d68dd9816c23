"""A seeded, GPU-free stand-in for ``vllm serve``: vLLM's HTTP API, metrics and LoRA behaviour.

Pure core: ``timing`` (parameters and their sources), ``engine`` (scheduler, KV cache, LoRA slots
and caches), ``text`` (token counts and seeded output), ``protocol`` (request checks, response
shapes). Shell: ``adapters`` (reads adapter directories), ``metrics`` (Prometheus), ``server``
(aiohttp and the stepping task) and ``cli`` (``lorapool sim``). See README.md in this package.
"""
