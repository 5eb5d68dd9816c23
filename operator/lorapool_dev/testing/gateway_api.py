"""Gateway API's own CRDs (GatewayClass, Gateway, HTTPRoute, ReferenceGrant), from the Go module
proxy, so the real API server judges the Gateways and HTTPRoutes of docs/gateway.md.

The module zip of ``sigs.k8s.io/gateway-api`` carries the release's generated CRDs under
``config/crd/standard``; ``go mod download`` fetches it into Go's module cache (once, ~1 s) and
nothing is built. GIE's module, which would carry the InferencePool CRD, is not on the proxy here:
``lorapool_dev.testing.inferencepool_crd`` writes that one.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from lorapool_dev.gotool import go_env, go_output

GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
GATEWAY_API_VERSION = "v1.6.3"  # the standard channel's v1 HTTPRoute; needs no newer Go than the machine's
KINDS = ("gatewayclasses", "gateways", "httproutes", "referencegrants")


def gateway_api_crds(version: str = GATEWAY_API_VERSION) -> list[Path]:
    """The standard-channel CRD files of ``KINDS``, from Go's module cache (downloaded when missing)."""
    with tempfile.TemporaryDirectory() as outside_any_module:
        out = go_output(
            ["mod", "download", "-json", f"{GATEWAY_API_MODULE}@{version}"], Path(outside_any_module), go_env()
        )
    directory = Path(json.loads(out)["Dir"]) / "config" / "crd" / "standard"
    files = [directory / f"gateway.networking.k8s.io_{kind}.yaml" for kind in KINDS]
    if missing := [f for f in files if not f.is_file()]:
        raise FileNotFoundError(f"{GATEWAY_API_MODULE}@{version} has no {', '.join(map(str, missing))}")
    return files
