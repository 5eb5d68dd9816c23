"""`lorapool dev --gateway envoy`: the playground's pool behind a real Envoy, configured as a Gateway
API Inference Extension gateway configures itself for the pool's rendered InferencePool.

What comes from the cluster, not from this file: the InferencePool the operator rendered (its
``endpointPickerRef.failureMode`` becomes Envoy's ``failure_mode_allow``) and the router
Deployment's picker flags (``--ext-proc-*``), which the playground's router process runs with,
its ports moved to free local ones. Envoy then asks the picker per request over ext_proc (full
duplex streamed, TLS to the picker's self-signed certificate) and forwards to the engine it names
(``ORIGINAL_DST`` on ``x-gateway-destination-endpoint``), as it would in a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

GATEWAY_NAMESPACE = "lorapool-gateway"  # where the playground says its gateway's pods run (NetworkPolicy peers)
_PORT_FLAGS = ("--ext-proc-port", "--ext-proc-health-port")
_FILE_FLAGS = ("--ext-proc-tls-cert", "--ext-proc-tls-key")  # a mounted Secret: not on this machine


def gateway_pool(pool_doc: dict[str, Any]) -> None:
    """Open the gateway door of the playground's pool: ``both`` (the HTTP router stays), a gateway
    namespace for the NetworkPolicy when the pool names none."""
    router = pool_doc["spec"].setdefault("router", {})
    if router.get("frontDoor", "router") == "router":
        router["frontDoor"] = "both"
    gateway = router.setdefault("gateway", {})
    if not gateway.get("namespace") and not gateway.get("cidrs"):
        gateway["namespace"] = GATEWAY_NAMESPACE


@dataclass(frozen=True)
class PickerFlags:
    """The rendered router Deployment's picker flags, as the playground's router runs them."""

    argv: tuple[str, ...]  # to add to the router's command line
    port: int  # the ext_proc listener, local
    message_timeout_s: float
    dropped: tuple[str, ...]  # flags this machine cannot honour (Secret files), said aloud


def picker_flags(deployment: dict[str, Any], free_port: Callable[[], int], default_timeout_s: float) -> PickerFlags:
    """The ``--ext-proc-*`` flags of the rendered router container, ports moved to free local ones.

    Raises when the Deployment has none: the operator did not render the gateway door."""
    args: Sequence[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    out: list[str] = []
    dropped: list[str] = []
    port = 0
    timeout_s = default_timeout_s
    i = 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        i += 2 if value is not None else 1
        if not flag.startswith("--ext-proc-"):
            continue
        if flag in _FILE_FLAGS:
            dropped.append(f"{flag} {value}")
            continue
        if flag in _PORT_FLAGS:
            value = str(free_port())
            port = int(value) if flag == "--ext-proc-port" else port
        if flag == "--ext-proc-message-timeout" and value is not None:
            timeout_s = float(value)
        out += [flag, *([value] if value is not None else [])]
    if not port:
        raise SystemExit("lorapool dev --gateway: the rendered router Deployment has no --ext-proc-port")
    return PickerFlags(tuple(out), port, timeout_s, tuple(dropped))


def failure_mode(inference_pool: dict[str, Any]) -> str:
    return str(((inference_pool.get("spec") or {}).get("endpointPickerRef") or {}).get("failureMode") or "FailClose")


def start_gateway(
    inference_pool: dict[str, Any], picker: PickerFlags, engines: Sequence[str], free_port: Callable[[], int]
) -> Any:
    """A real Envoy in front of the picker, configured from the InferencePool; returns the running Envoy."""
    from lorapool_dev.testing.envoy import FailureMode, GatewayConfig, bootstrap, start_envoy

    config = GatewayConfig(
        listen_port=free_port(),
        picker=f"127.0.0.1:{picker.port}",
        admin_port=free_port(),
        tls=True,
        failure_mode=FailureMode(failure_mode(inference_pool)),
        message_timeout_s=picker.message_timeout_s,
        fallback_endpoints=tuple(engines),
    )
    return start_envoy(bootstrap(config))


def read_door(cluster: Any, pool: dict[str, Any], free_port: Callable[[], int]) -> tuple[dict[str, Any], PickerFlags]:
    """The pool's rendered InferencePool and its router Deployment's picker flags, from the API server."""
    from lorapool.render import names
    from lorapool.router.settings import RouterSettings
    from lorapool_dev.testing.wait import wait_until

    ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]

    def get(kind: str, object_name: str) -> dict[str, Any] | None:
        result = cluster.kubectl("get", kind, object_name, "-n", ns, "-o", "json", check=False)
        return dict(json.loads(result.stdout)) if result.returncode == 0 else None

    inference_pool = wait_until(
        f"InferencePool {ns}/{name}", lambda: get("inferencepool", names.inference_pool(name)), 60
    )
    deployment = get("deployment", names.router(name))
    if deployment is None:
        raise SystemExit(f"lorapool dev --gateway: no Deployment {ns}/{names.router(name)}")
    return inference_pool, picker_flags(deployment, free_port, RouterSettings().ext_proc_message_timeout_s)
