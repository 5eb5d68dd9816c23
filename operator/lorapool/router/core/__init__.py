"""The router's pure core: every decision the router makes, over plain data. Pure.

No I/O, no asyncio, no aiohttp, and nothing from the router's shell: one import-linter contract
(source ``lorapool.router.core``) and one mypy entry (strict) cover every module here, so a new
module is covered by being put here.

``backend`` (what a policy reads), ``policy`` (filters -> weighted scorers -> picker), ``plugin``
(a plugin's name, factory and weight), ``filters/``, ``scorers/``, ``pickers`` and ``hold_rules``
(the plugins, one module each), ``registry`` (every plugin by name and the named ``--policy``
values), ``state`` (per-backend accounting; engine pages are read by ``lorapool.api.vllm_metrics``),
``waitqueue`` (per-adapter grouping queues), ``discovery`` (EndpointSlices -> URLs and pods),
``reports`` (the sidecars' reports -> where an adapter stands: loaded, loading, failed, unknown)
and ``requestcount`` (requests per adapter over windows, for placement).
"""
