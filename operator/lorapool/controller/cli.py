"""`lorapool operator`: run the Kubernetes operator."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable


def _positive(kind: type[float] | type[int]) -> Callable[[str], float]:
    """An argparse type: a number above 0, or an error naming what was given."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} is not above 0: a rate limit of 0 would never write")
        return value

    return parse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, in-cluster config, then ~/.kube/config)",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--image",
        default=os.environ.get("LORAPOOL_IMAGE"),
        help="lorapool image for sidecars and routers (default: $LORAPOOL_IMAGE or the release image)",
    )
    parser.add_argument("--resync-seconds", type=float, default=60.0, help="drift-correction period (default 60)")
    parser.add_argument(
        "--metadata-timeout-seconds",
        type=float,
        default=10.0,
        help="timeout for reading one adapter_config.json (default 10)",
    )
    parser.add_argument(
        "--status-write-qps",
        type=_positive(float),
        default=100.0,
        help="LoRAAdapter status writes a second, one bucket per operator (default 100; docs/status.md)",
    )
    parser.add_argument(
        "--status-write-burst",
        type=_positive(int),
        default=200,
        help="status writes allowed at once above that rate (default 200)",
    )
    parser.add_argument("--bind", default="0.0.0.0", help="address for the metrics and liveness servers")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics port (default 8080)")
    parser.add_argument(
        "--liveness-port", type=int, default=8081, help="liveness endpoint /healthz port (default 8081)"
    )
    parser.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a Lease so only one replica reconciles (default on)",
    )
    parser.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "lorapool-system"))
    parser.add_argument("--leader-election-name", default="lorapool-operator")
    parser.add_argument("--identity", default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def run(args: argparse.Namespace) -> int:
    import asyncio

    from lorapool import logs
    from lorapool.controller.app import OperatorConfig, run_operator
    from lorapool.controller.reconcile import Settings
    from lorapool.render.manifests import RenderOptions

    logs.setup(args.log_level)
    cfg = OperatorConfig(
        kubeconfig=args.kubeconfig,
        namespaces=tuple(args.namespace),
        settings=Settings(
            render=RenderOptions(lorapool_image=args.image) if args.image else RenderOptions(),
            metadata_timeout_s=args.metadata_timeout_seconds,
            write_qps=args.status_write_qps,
            write_burst=args.status_write_burst,
        ),
        resync_s=args.resync_seconds,
        metrics_port=args.metrics_port,
        liveness_port=args.liveness_port,
        bind=args.bind,
        leader_election=args.leader_election,
        lease_namespace=args.leader_election_namespace,
        lease_name=args.leader_election_name,
        identity=args.identity,
    )
    try:
        return asyncio.run(run_operator(cfg))
    except KeyboardInterrupt:
        return 0
