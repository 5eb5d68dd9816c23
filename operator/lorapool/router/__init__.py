"""The grouping router: an adapter-aware OpenAI proxy in front of a pool's vLLM replicas.

Pure core (no I/O, no asyncio, no aiohttp; an import-linter contract keeps it so): ``backend``
(what a policy reads), ``policy`` (filters -> weighted scorers -> picker), ``plugin`` (a plugin's
name, factory and weight), ``filters/``, ``scorers/`` and ``pickers`` (the plugins, one module
each), ``registry`` (every plugin by name and the named ``--policy`` values), ``state``
(per-backend accounting; engine pages are read by ``lorapool.api.vllm_metrics``), ``waitqueue``
(per-adapter grouping queues), ``discovery`` (EndpointSlices -> URLs and pods) and ``reports``
(the sidecars' reports -> where an adapter stands: loaded, loading, failed, unknown).

Shell: ``app`` (aiohttp proxy), ``scheduler`` (binds requests late), ``poller``, ``kubewatch``
(list+watch), ``endpointslices`` and ``podreports`` (the Kubernetes watches), ``telemetry``
(Prometheus) and ``cli``.
"""
