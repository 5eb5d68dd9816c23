"""`lorapool cluster`: build and run the local Kubernetes control plane.

    lorapool cluster build                      compile and cache the binaries (once, ~25 min)
    lorapool cluster up --kubeconfig PATH       start it; returns when nodes are Ready
    lorapool cluster status                     binaries, processes and health
    lorapool cluster down                       stop it and delete its state

Called by `lorapool.cli`; heavy modules are imported inside `run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    def with_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dir",
            type=Path,
            default=None,
            dest="state_dir",
            help="state directory: pids, logs, certificates, etcd data "
            "(default: $LORAPOOL_CACHE/cluster, i.e. ~/.cache/lorapool/cluster)",
        )

    build = sub.add_parser("build", help="build and cache the control-plane binaries")
    build.add_argument("components", nargs="*", help="subset to build (default: all)")

    up = sub.add_parser("up", help="start the control plane in the background")
    up.add_argument("--kubeconfig", type=Path, required=True, help="where to write the admin kubeconfig")
    up.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        dest="timeout_s",
        help="seconds to wait for the cluster to become ready (default: 180)",
    )
    up.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    with_dir(up)

    down = sub.add_parser("down", help="stop the control plane and delete its state")
    with_dir(down)

    status = sub.add_parser("status", help="show binaries, processes and health")
    with_dir(status)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from lorapool import logs
    from lorapool_dev.cluster import build
    from lorapool_dev.cluster.runtime import ClusterError, LocalCluster

    logs.setup("INFO")
    command = args.cluster_command
    try:
        if command == "build":
            return build.main(args.components)
        if command == "up":
            if not args.no_build:
                build.ensure_built()
            cluster = LocalCluster.attach(args.state_dir)
            if cluster.status().get("running"):
                print(
                    f"lorapool cluster: already running from {cluster.layout.root}; kubeconfig {cluster.kubeconfig}",
                    file=sys.stderr,
                )
                return 0
            LocalCluster(args.state_dir, kubeconfig=args.kubeconfig, timeout_s=args.timeout_s, detach=True).start()
            print(f"export KUBECONFIG={args.kubeconfig.expanduser().resolve()}")
            return 0
        if command == "down":
            LocalCluster.attach(args.state_dir).stop()
            return 0
        if command == "status":
            report: dict[str, Any] = {
                "binaries": build.describe(),
                "cluster": LocalCluster.attach(args.state_dir).status(),
            }
            print(json.dumps(report, indent=2))
            return 0 if report["cluster"].get("running") else 3
    except ClusterError as err:
        print(f"lorapool cluster {command}: {err}", file=sys.stderr)
        return 1
    raise AssertionError(f"unknown cluster command {command}")
