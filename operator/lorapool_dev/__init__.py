"""lorapool's development wing: what only development uses, beside the product package.

The local control plane and real node (``cluster``), vLLM's CPU build with a tiny local model
(``engine``), image builds without Docker (``image``), test helpers (``testing``), the playground
(``dev``) and the benchmark's load generator (``sim.loadgen``). Nothing in ``lorapool`` imports
this package (an import contract says so in one line); ``lorapool cluster|engine|image|dev`` load
it by name and say how to install it when it is missing. The image does not carry it.
"""
