"""`lorapool plan -f FILE [-o table|json]`: the derived vLLM flags and why, offline."""

from __future__ import annotations

import argparse
import json

from lorapool.errors import LoRAPoolError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="YAML with a LoRAPool (and optionally LoRAAdapters); '-' reads stdin; repeatable",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")


def run(args: argparse.Namespace) -> int:
    from lorapool.commands.common import fail, plan_offline, read_inputs

    try:
        inputs = read_inputs(args.filename)
        results = [(pool, *plan_offline(pool, inputs.adapters)) for pool in inputs.pools]
    except LoRAPoolError as exc:
        return fail(exc, "plan")
    if args.output == "json":
        out = [
            plan.to_status().to_wire()
            | {"pool": f"{pool.metadata.namespace}/{pool.metadata.name}", "warnings": list(plan.warnings)}
            for pool, plan, _ in results
        ]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    else:
        from lorapool.commands.explain import explain_plan

        print("\n\n".join(explain_plan(pool, plan, len(merged.adapters)) for pool, plan, merged in results))
    return 0
