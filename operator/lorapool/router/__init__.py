"""The grouping router: an adapter-aware OpenAI proxy in front of a pool's vLLM replicas.

Pure core (no I/O, no asyncio, no aiohttp): ``backend`` (what a policy reads), ``policy``
(filters -> weighted scorers -> picker), ``filters/``, ``scorers/``, ``pickers``, ``policies``
(the named policies), ``state`` (per-backend accounting), ``waitqueue`` (per-adapter grouping
queues), ``engine_metrics`` (vLLM /metrics parsing) and ``discovery`` (EndpointSlices -> URLs).

Shell: ``app`` (aiohttp proxy), ``scheduler`` (binds requests late), ``poller``,
``endpointslices`` (Kubernetes watch), ``telemetry`` (Prometheus) and ``cli``.
"""
