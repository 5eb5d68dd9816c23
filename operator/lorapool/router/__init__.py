"""The grouping router: an adapter-aware OpenAI proxy in front of a pool's vLLM replicas.

Pure core: ``core/`` (the policy, its plugins, per-backend accounting, wait queues, reports,
discovery, request counts; see its docstring). Shell, around it: ``app`` (aiohttp proxy),
``scheduler`` (binds requests late), ``poller``, ``kubewatch`` (list+watch), ``endpointslices``
and ``podreports`` (the Kubernetes watches), ``publisher`` (request counts on the router's Pod),
``telemetry`` (Prometheus), ``settings``, ``server`` (wiring) and ``cli``.
"""
