"""`lorapool render -f FILE`: every object the operator applies, as multi-document YAML.

Usable as an Argo CD config-management plugin or in any GitOps pipeline: output goes
to stdout, problems to stderr with a non-zero exit and nothing on stdout. Each pool is planned,
placed and rendered by ``render.desired.desired_state``, the function the operator's reconcile
calls, so the output is what the operator applies to a new pool.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


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
    from lorapool.commands.common import fail, read_inputs
    from lorapool.errors import LoRAPoolError, PlanError
    from lorapool.plan.adapters import merge_adapters
    from lorapool.render.desired import desired_state
    from lorapool.render.manifests import RenderOptions

    options = RenderOptions(lorapool_image=args.image) if args.image else RenderOptions()
    try:
        inputs = read_inputs(args.filename)
        objects: list[dict[str, Any]] = []
        for pool in inputs.pools:
            # Ranks as the spec writes them (sources are not read offline); no pods, no status: the
            # placement a new pool starts from, planned, placed and rendered as the operator does.
            merged = merge_adapters(pool, inputs.adapters)
            desired = desired_state(pool, [(a, a.spec.rank) for a in merged.adapters], options)
            if desired.plan is None:
                raise PlanError(desired.plan_errors)
            objects.extend(desired.objects)
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
