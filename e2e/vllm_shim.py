#!/usr/bin/env python3
"""`vllm serve MODEL FLAGS` for the simulator image: runs `lorapool sim` with the same flags.

Installed as `vllm` only in the Dockerfile's `sim` target, so a LoRAPool whose
`spec.vllm.image` is that image runs the simulator where the renderer's
`command: [vllm, serve]` expects vLLM. Used by the kind e2e (e2e/kind.sh) and for demos
on clusters without GPUs; the real image never contains it.

The simulator names its flags as vLLM does, but it has no positional model and no
flags for things it does not model (dtype, tensor parallelism, weight loading). Those
are translated or dropped here, each drop said on stderr; every other flag goes to the
simulator unchanged, so a flag it does not know still fails loudly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# Flags `vllm serve` takes that change nothing in the simulator -> how many values follow
# ("+" = every value up to the next flag). They are the ones the renderer can emit.
DROPPED: dict[str, int | str] = {
    "--dtype": 1,
    "--tensor-parallel-size": 1,
    "-tp": 1,
    "--lora-dtype": 1,
    "--lora-target-modules": "+",
    "--revision": 1,
    "--load-format": 1,
}


def translate(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`vllm` argv (without the program name) -> (`lorapool sim` args, notes on dropped flags).

    Raises ValueError for anything but `serve`. A positional model must come first, as in
    `vllm serve MODEL`; anything the simulator does not accept still reaches it and fails there.
    """
    if not argv or argv[0] != "serve":
        raise ValueError("this image's vllm only runs the simulator: use `vllm serve MODEL [FLAGS]`")
    rest = list(argv[1:])
    out: list[str] = []
    if rest and not rest[0].startswith("-"):
        out = ["--model", rest.pop(0)]  # `vllm serve MODEL ...`, as the renderer writes it
    notes: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        flag, eq, _ = arg.partition("=")
        arity = DROPPED.get(flag)
        if arity is None:
            out.append(arg)
            i += 1
            continue
        if eq:
            end = i + 1
        elif arity == "+":
            end = i + 1
            while end < len(rest) and not rest[end].startswith("-"):
                end += 1
        else:
            end = i + 1 + int(arity)
        notes.append(f"vllm shim: the simulator ignores {' '.join(rest[i:end])}")
        i = end
    return out, notes


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, notes = translate(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        print(f"vllm shim: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(note, file=sys.stderr)
    command = [sys.executable, "-m", "lorapool.cli", "sim", *args]
    sys.stderr.flush()
    os.execv(sys.executable, command)  # PID 1 stays the simulator: signals reach it
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
