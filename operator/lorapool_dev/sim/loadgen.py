"""A small closed-loop load generator for an OpenAI-compatible server (the simulator, a router).

Used to measure how many requests per second the simulator sustains at ``--time-scale 0`` (its
own overhead, the ceiling a router benchmark can reach) and for quick smoke loads:

    python -m lorapool_dev.sim.loadgen http://127.0.0.1:8000 --requests 5000 --concurrency 64 \\
        --models sql,chat --max-tokens 16 [--stream]

Prints one JSON line: requests, errors, seconds, req_per_s, p50/p99 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections.abc import Sequence

import aiohttp


async def run_load(
    url: str, *, requests: int, concurrency: int, models: Sequence[str], max_tokens: int, stream: bool
) -> dict[str, float]:
    """Send ``requests`` completions from ``concurrency`` workers; return throughput and latency."""
    counter = itertools.count()
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def worker() -> None:
            nonlocal errors
            while (i := next(counter)) < requests:
                body = {
                    "model": models[i % len(models)],
                    "prompt": f"request {i}",
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "stream": stream,
                }
                started = time.perf_counter()
                async with session.post(f"{url}/v1/completions", json=body) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": requests,
        "errors": errors,
        "seconds": round(seconds, 3),
        "req_per_s": round(requests / seconds, 1),
        "p50_s": round(latencies[len(latencies) // 2], 4),
        "p99_s": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--models", default="", help="comma-separated model names (default: the first in /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if not models:
        import urllib.request

        with urllib.request.urlopen(f"{args.url}/v1/models", timeout=10) as response:
            models = [json.load(response)["data"][0]["id"]]
    result = asyncio.run(
        run_load(
            args.url,
            requests=args.requests,
            concurrency=args.concurrency,
            models=models,
            max_tokens=args.max_tokens,
            stream=args.stream,
        )
    )
    print(json.dumps(result))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
