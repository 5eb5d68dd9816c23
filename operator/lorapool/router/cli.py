"""``lorapool router``: flags -> ``RouterSettings`` -> the running proxy.

Heavy imports (aiohttp, kubernetes) happen inside ``run`` so ``lorapool --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from lorapool.router.core import registry
from lorapool.router.core.scorers.prefix import PREFIX_WEIGHT
from lorapool.router.settings import DOCUMENT_FLAGS, MIB, RouterSettings


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the router's flags to its subcommand parser, one group of flags per step."""
    defaults = RouterSettings()
    _add_listen_flags(parser, defaults)
    _add_backend_flags(parser)
    _add_policy_flags(parser, defaults)
    _add_capacity_flags(parser, defaults)
    _add_limit_flags(parser, defaults)
    _add_saturation_flags(parser, defaults)
    _add_timing_flags(parser, defaults)
    _add_picker_flags(parser, defaults)
    _add_shared_state_flags(parser, defaults)
    _add_debug_flags(parser)


def _add_listen_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    parser.add_argument("--host", default=d.host, help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=d.port, help="port (default %(default)s)")


def _add_backend_flags(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--backend", action="append", metavar="URL", help="a vLLM (or lorapool sim) base URL; repeat for each replica"
    )
    where.add_argument(
        "--endpointslices",
        metavar="NAMESPACE/SERVICE",
        help="watch the Service's EndpointSlices for ready backends (in cluster or KUBECONFIG)",
    )
    parser.add_argument("--port-name", help="EndpointSlice port name (default: only port / http)")
    parser.add_argument(
        "--report-pods",
        metavar="NAMESPACE/SELECTOR",
        help="watch these engine Pods and route by their sidecars' reports (loaded / loading / failed);"
        " default: none, /v1/models alone says what each backend serves",
    )
    parser.add_argument(
        "--adapters-configmap",
        metavar="NAMESPACE/NAME",
        help="the pool's adapter set (its index ConfigMap), read and watched through the API: an adapter"
        " it names is held while it loads, and 404 is kept for names the pool does not have",
    )
    parser.add_argument(
        "--backend-pod",
        action="append",
        metavar="URL=POD",
        help="the Pod whose report describes a --backend (repeatable); EndpointSlices name theirs,"
        " other backends are matched by pod IP",
    )


def policy_help(default: str = RouterSettings.policy) -> str:
    """``--policy``'s help: every registered policy with its summary and plugin chain."""
    lines = [f"{p.name}: {p.summary} [{p.strict.describe()}]" for p in registry.POLICIES.values()]
    return "; ".join(lines) + f" (default {default})"


POLICY_FLAGS = {name: knob for knob, name in DOCUMENT_FLAGS.items()}
"""The flags that feed the policy document, settings field -> argparse dest: with ``--policy-file``
each one given replaces the document's knob; their argparse default is None so that "given" can be
told from "default" (``settings_from`` puts the settings' default in)."""

OVER = " (with --policy-file: replaces the document's"


def _add_policy_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    parser.add_argument(
        "--policy-file",
        metavar="FILE",
        help="the router policy document (apiVersion lorapool.io/v1alpha1, kind RouterPolicy: profiles, weights,"
        " plugin parameters; the <pool>-router-policy ConfigMap's policy.json, docs/router-policy.md), re-read"
        " when it changes, the last good one kept on a bad edit; the flags given beside it (--policy,"
        " --load-factor, --load-slack, --hold-rule, --prefix-weight, --fair-dispatch, --max-prefilling,"
        " --max-inflight, --max-queue-wait, --max-wait, --max-loras, --max-cpu-loras) override its matching"
        " knobs; default: none, the flags alone describe the policy",
    )
    parser.add_argument(
        "--policy", choices=registry.names(), default=None, help=policy_help(d.policy) + OVER + " chain)"
    )
    parser.add_argument(
        "--load-factor",
        type=float,
        default=None,
        help=f"affinity: bounded-load cap as a multiple of the mean load (default {d.load_factor:g})"
        + OVER
        + " parameters.bounded-load.loadFactor)",
    )
    parser.add_argument(
        "--load-slack",
        type=float,
        default=None,
        metavar="REQUESTS",
        help=f"affinity: requests a backend may run above the mean before spreading (default {d.load_slack:g})"
        + OVER
        + " parameters.bounded-load.loadSlack)",
    )
    parser.add_argument(
        "--prefix-weight",
        type=float,
        nargs="?",
        const=PREFIX_WEIGHT,
        default=None,
        metavar="W",
        help="affinity: weight of the prefix scorer, which prefers, among the replicas lora-affinity ranks"
        " alike, the one recently sent the prompt's head for the same adapter (its KV prefix cache);"
        f" the flag alone: {PREFIX_WEIGHT:g}, between least-load's 1 and lora-affinity's level gap of 2"
        f" (default {d.prefix_weight:g}: off)" + OVER + " weights.prefix)",
    )
    parser.add_argument(
        "--hold-rule",
        choices=[p.name for p in registry.HOLDS],
        default=None,
        help="policies that hold: whether a request that fits no replica's LoRA slots waits for one"
        " (hold-always) or only while its adapter runs somewhere (hold-if-active); default: the policy's"
        + OVER
        + " hold)",
    )


def _add_capacity_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    """What the router assumes of the engines until they report it (the document's slots)."""
    parser.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help=f"GPU LoRA slots assumed until a backend reports its own (default {d.max_loras})"
        + OVER
        + " slots.maxLoras)",
    )
    parser.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="the replicas' --max-cpu-loras, to prefer CPU-cached adapters (default unknown)"
        + OVER
        + " slots.maxCpuLoras)",
    )


def _add_saturation_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    """The saturation hold and fair dispatch (docs/traffic.md): off by default."""
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        metavar="N",
        help="requests each backend may run at once; above it requests wait in the router (hold reason"
        f" saturated) so the router orders them, not the engine (default {d.max_inflight}: no cap)"
        + OVER
        + " dispatch.maxInflight)",
    )
    parser.add_argument(
        "--max-prefilling",
        type=int,
        default=None,
        metavar="N",
        help="requests each backend may hold before their first token; above it requests wait in the"
        " router (hold reason saturated), so a flood queues in the router, where fair dispatch orders"
        f" it, not in the engine's first-come prefill queue (default {d.max_prefilling}: no cap)"
        + OVER
        + " dispatch.maxPrefilling)",
    )
    parser.add_argument(
        "--max-queue-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="longest a request waits because every backend is at its --max-inflight or --max-prefilling"
        f" (then best-effort; default {d.max_queue_wait_s:g})" + OVER + " dispatch.maxQueueWaitSeconds)",
    )
    parser.add_argument(
        "--fair-dispatch",
        action="store_true",
        default=None,
        help="serve held requests by a virtual token counter per adapter, weighted by priority class"
        " (docs/traffic.md), instead of class then age" + OVER + " dispatch.fair)",
    )


def _add_limit_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="longest a request waits in the router: for a LoRA slot (then best-effort) or for its adapter"
        f" to finish loading (then 503) (default {d.max_wait_s:g})" + OVER + " dispatch.maxWaitSeconds)",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        default=d.max_queued,
        help="requests held in all adapter queues before 429 (default %(default)s)",
    )
    parser.add_argument(
        "--traffic-file",
        metavar="FILE",
        help="every adapter's priority and rate limits (the <pool>-traffic ConfigMap's traffic.json, docs/traffic.md),"
        " re-read when it changes (default: none, every adapter standard and unlimited)",
    )
    parser.add_argument(
        "--max-model-labels",
        type=int,
        default=d.max_model_labels,
        help="distinct model/adapter label values in the router's metrics (the pool's adapters, first come);"
        " the rest count as 'other' (default %(default)s)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help=f"largest request body, else 413 (default {d.max_body_bytes // MIB} MiB)",
    )


def _add_timing_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=d.poll_interval_s,
        metavar="SECONDS",
        help="how often backends' /metrics and /v1/models are read (default %(default)s)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=d.connect_timeout_s,
        metavar="SECONDS",
        help="time to connect to a backend before trying another (default %(default)s)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=d.read_timeout_s,
        metavar="SECONDS",
        help="longest silence from a backend mid-response (default %(default)s)",
    )
    parser.add_argument(
        "--departed-grace",
        type=float,
        default=d.departed_grace_s,
        metavar="SECONDS",
        help="how long a request bound to a backend that left the endpoints waits for its first byte"
        " before it is retried elsewhere (default %(default)s)",
    )
    parser.add_argument(
        "--requests-window-s",
        type=float,
        default=d.requests_window_s,
        metavar="SECONDS",
        help="requests are counted per adapter over windows this long; the last closed one is served at"
        " GET /lorapool/requests (default %(default)s, as the sidecars' observation window)",
    )
    parser.add_argument(
        "--pod",
        metavar="NAMESPACE/NAME",
        help="the router's own Pod: each closed window of request counts is written on it (annotation"
        " lorapool.io/requests, credentials from KUBECONFIG or in cluster); default $POD_NAMESPACE/$POD_NAME,"
        " none: counts are only served at GET /lorapool/requests",
    )


def _add_picker_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    g = parser.add_argument_group("endpoint picker (Gateway API Inference Extension, Envoy ext_proc)")
    g.add_argument(
        "--ext-proc-port",
        type=int,
        metavar="PORT",
        help="also serve the policy as a GIE endpoint picker: Envoy's ext_proc over gRPC on this port"
        " (TLS unless --ext-proc-insecure), beside the HTTP --port (default: off)",
    )
    g.add_argument(
        "--ext-proc-health-port",
        type=int,
        metavar="PORT",
        help="plaintext gRPC health (liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor) (default: off)",
    )
    g.add_argument("--ext-proc-tls-cert", metavar="FILE", help="serving certificate (a kubernetes.io/tls Secret's tls.crt);"
                   " default: self-signed, made at start")  # fmt: skip
    g.add_argument("--ext-proc-tls-key", metavar="FILE", help="its key (tls.key)")
    g.add_argument("--ext-proc-insecure", action="store_true", help="plaintext gRPC (local development and tests)")
    g.add_argument(
        "--ext-proc-message-timeout",
        type=float,
        default=d.ext_proc_message_timeout_s,
        metavar="SECONDS",
        help="the gateway's ext_proc message_timeout: a held request is sent best effort before it runs out"
        " (default %(default)s, Envoy's; set the gateway's above --max-wait to keep grouping's holds)",
    )
    g.add_argument(
        "--ext-proc-fallbacks",
        type=int,
        default=d.ext_proc_fallbacks,
        metavar="N",
        help="fallback endpoints listed after the pick, for gateways that read the list (default %(default)s:"
        " Envoy's ORIGINAL_DST cluster takes one address)",
    )


def _add_shared_state_flags(parser: argparse.ArgumentParser, d: RouterSettings) -> None:
    g = parser.add_argument_group("shared books (several routers deciding as one)")
    g.add_argument(
        "--shared-state",
        metavar="URL",
        help="a Redis-protocol store (redis://HOST[:PORT][/DB], rediss:// for TLS) holding every router's books:"
        " bound requests per replica and adapter, slot claims, rate-limit demand. Credentials from"
        " LORAPOOL_SHARED_STATE_USERNAME/PASSWORD or the URL. Default: this router's own books",
    )
    g.add_argument(
        "--shared-state-key",
        default=d.shared_state_key,
        metavar="KEY",
        help="the pool's name in the store's keys (the operator gives the pool's UID; default %(default)s)",
    )
    g.add_argument(
        "--shared-state-interval",
        type=float,
        default=d.shared_state_interval_s,
        metavar="SECONDS",
        help="heartbeat and resync period; a silent router's books expire after 4 of them (default %(default)s)",
    )
    g.add_argument(
        "--shared-state-deadline",
        type=float,
        default=d.shared_state_deadline_s,
        metavar="SECONDS",
        help="a store call slower than this fails: the router decides from its own books (default %(default)s)",
    )


def _add_debug_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend-header", action="store_true", help="add X-Lorapool-Backend to responses (debugging)")
    parser.add_argument(
        "--event-loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="uvloop (libuv, C) or the standard library's loop (default %(default)s; asyncio to compare)",
    )
    parser.add_argument("--log-level", default="INFO", help="default %(default)s")


def settings_from(args: argparse.Namespace) -> RouterSettings:
    from lorapool.podstatus import PodRef
    from lorapool.router.podreports import parse_backend_pod

    pod = PodRef.parse(args.pod) if args.pod else PodRef.from_env()
    d = RouterSettings()

    return RouterSettings(
        host=args.host,
        port=args.port,
        backends=tuple(args.backend or ()),
        endpointslices=args.endpointslices,
        port_name=args.port_name,
        report_pods=args.report_pods,
        adapters_configmap=args.adapters_configmap,
        backend_pods=tuple(parse_backend_pod(v) for v in args.backend_pod or ()),
        policy_file=args.policy_file,
        policy_flags=tuple(name for name, dest in POLICY_FLAGS.items() if getattr(args, dest) is not None),
        policy=args.policy or d.policy,
        load_factor=d.load_factor if args.load_factor is None else args.load_factor,
        load_slack=d.load_slack if args.load_slack is None else args.load_slack,
        prefix_weight=d.prefix_weight if args.prefix_weight is None else args.prefix_weight,
        hold_rule=args.hold_rule or "",
        max_loras=d.max_loras if args.max_loras is None else args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_wait_s=d.max_wait_s if args.max_wait is None else args.max_wait,
        max_queued=args.max_queued,
        traffic_file=args.traffic_file,
        max_inflight=d.max_inflight if args.max_inflight is None else args.max_inflight,
        max_prefilling=d.max_prefilling if args.max_prefilling is None else args.max_prefilling,
        max_queue_wait_s=d.max_queue_wait_s if args.max_queue_wait is None else args.max_queue_wait,
        fair_dispatch=bool(args.fair_dispatch),
        max_body_bytes=args.max_body_bytes,
        max_model_labels=args.max_model_labels,
        poll_interval_s=args.poll_interval,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.read_timeout,
        departed_grace_s=args.departed_grace,
        backend_header=args.backend_header,
        requests_window_s=args.requests_window_s,
        pod=str(pod) if pod is not None else None,
        ext_proc_port=args.ext_proc_port,
        ext_proc_health_port=args.ext_proc_health_port,
        ext_proc_tls_cert=args.ext_proc_tls_cert,
        ext_proc_tls_key=args.ext_proc_tls_key,
        ext_proc_insecure=args.ext_proc_insecure,
        ext_proc_message_timeout_s=args.ext_proc_message_timeout,
        ext_proc_fallbacks=args.ext_proc_fallbacks,
        shared_state=args.shared_state,
        shared_state_key=args.shared_state_key,
        shared_state_interval_s=args.shared_state_interval,
        shared_state_deadline_s=args.shared_state_deadline,
    )


def run(args: argparse.Namespace) -> int:
    """Run the router until SIGINT/SIGTERM."""
    import asyncio

    from lorapool import logs
    from lorapool.router.server import loop_factory, serve

    logs.setup(args.log_level)
    try:
        settings = settings_from(args)
        with asyncio.Runner(loop_factory=loop_factory(args.event_loop)) as runner:
            runner.run(serve(settings))
    except ValueError as exc:
        print(f"lorapool router: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
