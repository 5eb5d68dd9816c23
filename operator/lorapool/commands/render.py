"""`lorapool render -f FILE`: every object the operator applies, as multi-document YAML.

Usable as an Argo CD config-management plugin or in any GitOps pipeline: output goes
to stdout, problems to stderr with a non-zero exit and nothing on stdout.
"""

from __future__ import annotations

import argparse
import os


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="YAML with a LoRAPool (and optionally LoRAAdapters); '-' reads stdin; repeatable",
    )
    parser.add_argument(
        "--image",
        default=os.environ.get("LORAPOOL_IMAGE"),
        help="lorapool image for the sidecar and router (default: $LORAPOOL_IMAGE or the release image)",
    )
    parser.add_argument(
        "--include-pool",
        action="store_true",
        help="also print the LoRAPool/LoRAAdapter inputs (a complete GitOps bundle)",
    )


def run(args: argparse.Namespace) -> int:
    from lorapool.api.yamlio import dump_all
    from lorapool.commands.common import fail, plan_offline, read_inputs
    from lorapool.controller.holders import decide_placement
    from lorapool.errors import LoRAPoolError
    from lorapool.render.manifests import RenderOptions, render_pool

    options = RenderOptions(lorapool_image=args.image) if args.image else RenderOptions()
    try:
        inputs = read_inputs(args.filename)
        objects = []
        for pool in inputs.pools:
            plan, merged = plan_offline(pool, inputs.adapters)
            # The placement a new pool starts from (no load observed yet), as the operator renders it.
            names = [a.spec.name for a in merged.adapters]
            placement = decide_placement(pool, names, plan.max_cpu_loras, {}, {}, now=0.0)
            objects.extend(render_pool(pool, plan, merged.adapters, options, placement.holders))
    except LoRAPoolError as exc:
        return fail(exc, "render")
    if args.include_pool:
        objects = [
            *(p.model_dump(by_alias=True, exclude_none=True, mode="json") for p in inputs.pools),
            *(a.model_dump(by_alias=True, exclude_none=True, mode="json") for a in inputs.adapters),
            *objects,
        ]
    print(dump_all(objects), end="")
    return 0
