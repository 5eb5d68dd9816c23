"""``lorapool sidecar``: keep a vLLM engine's LoRA adapters in line with the pool's ConfigMap.

    lorapool sidecar (--adapters-configmap NAMESPACE/NAME | --config adapters.json) \\
        --engine http://127.0.0.1:8000 \\
        --adapter-dir /adapters [--status-port 8081] [--host 127.0.0.1] [--resync-seconds 30] \\
        [--pod NAMESPACE/NAME] [--report-kubeconfig FILE] \\
        [--keep-unloaded-bytes 2147483648] [--keep-unloaded-max-age 3600]

In a pod it reads and watches the pool's adapter set through the API (--adapters-configmap,
lorapool.sources.setwatch) and reports what its engine holds on its own Pod (lorapool.api.report),
with the ServiceAccount token projected into this container only. --config reads a local file
instead (dev and tests).

Every download is verified against the base model's shape (``lorapool.sources.verify``) from
``--base-shape`` or ``$LORAPOOL_BASE_SHAPE`` (the operator renders the latter); without it, config
and weights only.

SIGHUP re-reads the config at once; SIGTERM/SIGINT stop cleanly.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lorapool.api.pool import DEFAULT_KEEP_UNLOADED_BYTES, DEFAULT_KEEP_UNLOADED_MAX_AGE_S
from lorapool.render.sidecar import BASE_SHAPE_ENV  # the variable the operator renders

if TYPE_CHECKING:
    from lorapool.sources.setwatch import SetRef
    from lorapool.sources.verify import BaseShape


def _config_flags(parser: argparse.ArgumentParser) -> None:
    """Where the adapter set comes from: the API (in a pod) or a local file (dev, tests); exactly one."""
    parser.add_argument("--config", type=Path, default=None, help="a local adapters.json (dev, tests)")
    parser.add_argument(
        "--adapters-configmap",
        default=None,
        help="NAMESPACE/NAME of the pool's adapter-set index ConfigMap, read and watched through the API "
        "with the --report-kubeconfig credentials (in a pod: its ServiceAccount token)",
    )
    parser.add_argument(
        "--config-resync-seconds", type=float, default=30.0, help="re-read --adapters-configmap at least this often"
    )


def _config_map(args: argparse.Namespace) -> SetRef | None:
    """``--adapters-configmap`` parsed; ValueError unless exactly one source of the set is given."""
    from lorapool.sources.setwatch import SetRef

    config_map = SetRef.parse(args.adapters_configmap) if args.adapters_configmap else None
    if (config_map is None) == (args.config is None):
        raise ValueError("give exactly one of --adapters-configmap (in a pod) and --config (a local file)")
    return config_map


def configure(parser: argparse.ArgumentParser) -> None:
    _config_flags(parser)
    parser.add_argument("--engine", required=True, help="vLLM base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--adapter-dir", required=True, type=Path, help="volume shared with the engine")
    parser.add_argument("--status-port", type=int, default=8081, help="port of /status, /healthz, /metrics")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve status on (0.0.0.0 in a pod)")
    parser.add_argument("--resync-seconds", type=float, default=30.0, help="full reconcile at least this often")
    parser.add_argument("--config-poll-seconds", type=float, default=2.0, help="how often to re-read --config")
    parser.add_argument("--health-poll-seconds", type=float, default=2.0, help="how often to probe engine /health")
    parser.add_argument("--http-timeout-seconds", type=float, default=10.0, help="timeout of engine list/unload/health")
    parser.add_argument("--load-timeout-seconds", type=float, default=120.0, help="timeout of one engine load")
    parser.add_argument("--download-timeout-seconds", type=float, default=1800.0, help="timeout of one download")
    parser.add_argument("--max-download-bytes", type=int, default=16 << 30, help="size limit of one adapter")
    parser.add_argument("--parallel-downloads", type=int, default=4, help="downloads at once")
    parser.add_argument("--backoff-base-seconds", type=float, default=1.0, help="first retry delay ceiling")
    parser.add_argument("--backoff-cap-seconds", type=float, default=300.0, help="largest retry delay")
    parser.add_argument("--pvc-root", type=Path, default=Path("/mnt/pvc"), help="where pvc://<claim> is mounted")
    parser.add_argument(
        "--pod",
        default=None,
        help="NAMESPACE/NAME of the Pod to report adapters on (default: $POD_NAMESPACE/$POD_NAME; none: no report)",
    )
    parser.add_argument(
        "--report-kubeconfig",
        type=Path,
        default=None,
        help="credentials for the report (default: the projected ServiceAccount token, in cluster)",
    )
    parser.add_argument(
        "--report-interval-seconds", type=float, default=2.0, help="at most one report write per this long"
    )
    parser.add_argument(
        "--observe-window-seconds",
        type=float,
        default=60.0,
        help="the report's engine observations (slot demand, slot waits, KV usage) cover this long",
    )
    parser.add_argument(
        "--slot-file",
        type=Path,
        default=None,
        help="downward-API file with this pod's placement slot (annotation lorapool.io/slot); "
        "without it the replica holds only adapters placed on every replica",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=30.0,
        help="keep an adapter placement moved to other replicas loaded this long before unloading it",
    )
    _keep_flags(parser)
    parser.add_argument(
        "--base-shape",
        default=None,
        help=f"the base model's shape as JSON, downloads are verified against it (default: ${BASE_SHAPE_ENV})",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed the backoff jitter (tests)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _keep_flags(parser: argparse.ArgumentParser) -> None:
    """spec.sidecar.keepUnloaded, rendered by lorapool.render.sidecar; the same defaults."""
    parser.add_argument(
        "--keep-unloaded-bytes",
        type=int,
        default=DEFAULT_KEEP_UNLOADED_BYTES,
        help="bytes of unloaded adapters' files kept for a place-back, least recently used evicted; 0: none",
    )
    parser.add_argument(
        "--keep-unloaded-max-age",
        type=float,
        default=float(DEFAULT_KEEP_UNLOADED_MAX_AGE_S),
        help="seconds an unloaded adapter's files are kept at most",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import random
    import signal

    from lorapool import logs
    from lorapool.podstatus import PodRef
    from lorapool.sidecar.agent import Agent, Settings
    from lorapool.sidecar.keep import KeepBudget
    from lorapool.sources import Limits

    logs.setup(args.log_level)
    try:
        pod = PodRef.parse(args.pod) if args.pod else PodRef.from_env()
        config_map = _config_map(args)
    except ValueError as exc:
        raise SystemExit(f"lorapool sidecar: {exc}") from None
    base_shape = _base_shape(args.base_shape or os.environ.get(BASE_SHAPE_ENV))
    settings = Settings(
        config_path=args.config,
        engine_url=args.engine,
        adapter_dir=args.adapter_dir,
        host=args.host,
        status_port=args.status_port,
        resync_s=args.resync_seconds,
        config_poll_s=args.config_poll_seconds,
        health_poll_s=args.health_poll_seconds,
        http_timeout_s=args.http_timeout_seconds,
        load_timeout_s=args.load_timeout_seconds,
        backoff_base_s=args.backoff_base_seconds,
        backoff_cap_s=args.backoff_cap_seconds,
        parallel_downloads=args.parallel_downloads,
        limits=Limits(max_bytes=args.max_download_bytes, total_timeout_s=args.download_timeout_seconds),
        pvc_root=args.pvc_root,
        pod=pod,
        report_kubeconfig=args.report_kubeconfig,
        report_interval_s=args.report_interval_seconds,
        observe_window_s=args.observe_window_seconds,
        slot_path=args.slot_file,
        drain_s=args.drain_seconds,
        keep=KeepBudget(max_bytes=args.keep_unloaded_bytes, max_age_s=args.keep_unloaded_max_age),
        base_shape=base_shape,
        config_map=config_map,
        config_resync_s=args.config_resync_seconds,
    )

    async def main() -> None:
        agent = Agent(settings, rng=random.Random(args.seed))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, agent.request_config_reload)
        await agent.run(stop)

    args.adapter_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(main())
    return 0


def _base_shape(text: str | None) -> BaseShape | None:
    """The base shape from the flag or env var; a bad one stops the sidecar (the operator rendered it)."""
    from lorapool.errors import AdapterError
    from lorapool.sources.verify import BaseShape

    if not text:
        return None
    try:
        return BaseShape.from_json(text)
    except AdapterError as exc:
        raise SystemExit(f"lorapool sidecar: --base-shape / ${BASE_SHAPE_ENV}: {exc}") from None
