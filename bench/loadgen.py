"""Open-loop load generation: a seeded request schedule and an aiohttp client that keeps it.

Open loop means arrivals follow the schedule whatever the latency, so a slow system builds a
queue instead of slowing the clients down (closed-loop generators hide exactly the tail this
benchmark is about). Arrivals are Poisson or Gamma (bursty, coefficient of variation > 1);
adapter popularity is uniform, Zipf(s) or one hot adapter plus a Zipf tail.

Each request streams (SSE), so time-to-first-token is measured at the client.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Workload:
    """One open-loop workload; everything random comes from ``seed``."""

    rate_rps: float
    duration_s: float
    adapters: int
    arrival: str = "poisson"  # poisson | gamma
    cv: float = 1.0  # coefficient of variation of inter-arrival times (gamma)
    popularity: str = "uniform"  # uniform | zipf | hot
    zipf_s: float = 1.0
    hot_share: float = 0.5  # popularity=hot: fraction of requests for adapter 0
    prompt_tokens: tuple[int, int] = (64, 256)
    output_tokens: tuple[int, int] = (16, 64)
    seed: int = 0
    # Regime (f), the noisy neighbour: this adapter also sends ``flood_factor`` x its share on
    # average, in bursts of ``burst_s`` every ``period_s``; "" for none. The flood's arrivals come
    # from their own random stream, so the run without it has the very same other arrivals.
    flood: str = ""
    flood_factor: float = 10.0
    burst_s: float = 1.0
    period_s: float = 4.0
    # Regime (g), chat (bench/chat.py): sessions of ``turns`` requests ``think_s`` apart, each
    # resending its history after a per-adapter system prompt of ``system_prompt_words``; 0: no
    # sessions, every request on its own.
    turns: int = 0
    think_s: float = 0.0
    system_prompt_words: int = 0


@dataclass(frozen=True)
class Planned:
    at_s: float
    model: str
    prompt: str
    max_tokens: int


def adapter_name(i: int) -> str:
    return f"lora-{i:04d}"


def _popularity_weights(w: Workload) -> list[float]:
    n = w.adapters
    if w.popularity == "uniform":
        return [1.0] * n
    zipf = [1.0 / (i + 1) ** w.zipf_s for i in range(n)]
    if w.popularity == "zipf":
        return zipf
    if w.popularity == "hot":
        tail = sum(zipf[1:]) or 1.0
        rest = 1.0 - w.hot_share
        return [w.hot_share] + [rest * z / tail for z in zipf[1:]]
    raise ValueError(f"popularity={w.popularity!r} is not uniform, zipf or hot")


def adapter_picker(w: Workload, rng: random.Random) -> Callable[[], str]:
    """Draws an adapter name by ``w``'s popularity, one ``rng.random()`` per draw."""
    cumulative = list(itertools.accumulate(_popularity_weights(w)))
    # Shuffle which adapter name is popular so that name order (and hashing) carries no luck.
    names = [adapter_name(i) for i in range(w.adapters)]
    rng.shuffle(names)

    def pick() -> str:
        return names[min(bisect.bisect_left(cumulative, rng.random() * cumulative[-1]), len(names) - 1)]

    return pick


def schedule(w: Workload) -> list[Planned]:
    """The arrival times, adapters, prompts and output lengths of one run."""
    rng = random.Random(w.seed)
    pick = adapter_picker(w, rng)
    plan: list[Planned] = []
    t = 0.0
    mean_gap = 1.0 / w.rate_rps
    shape = 1.0 / (w.cv * w.cv) if w.arrival == "gamma" else 1.0
    while True:
        if w.arrival == "poisson":
            t += rng.expovariate(1.0 / mean_gap)
        elif w.arrival == "gamma":
            t += rng.gammavariate(shape, mean_gap / shape)
        else:
            raise ValueError(f"arrival={w.arrival!r} is not poisson or gamma")
        if t >= w.duration_s:
            return plan
        plan.append(_planned(rng, t, pick(), w))


def _planned(rng: random.Random, at_s: float, model: str, w: Workload) -> Planned:
    words = rng.randint(*w.prompt_tokens)
    # The sim counts whitespace-separated words as tokens; a per-adapter preamble makes
    # prompts of one adapter share a prefix, as tenants' system prompts do.
    prompt = f"[{model}] " + " ".join(f"w{rng.randrange(10_000)}" for _ in range(words - 1))
    return Planned(at_s, model, prompt, rng.randint(*w.output_tokens))


def flood_schedule(w: Workload) -> list[Planned]:
    """The flood adapter's extra arrivals (regime (f)): Poisson within each burst, so that over a
    period it sends ``flood_factor`` x its share in all (its share, an equal part of ``rate_rps``,
    comes with ``schedule``: the workload's popularity is uniform)."""
    if not w.flood:
        return []
    if w.popularity != "uniform":
        raise ValueError(f"a flood needs popularity=uniform (its share is rate/adapters), not {w.popularity!r}")
    share = w.rate_rps / w.adapters
    burst_rate = share * (w.flood_factor - 1.0) * w.period_s / w.burst_s
    rng = random.Random(w.seed + 1)
    plan: list[Planned] = []
    start = 0.0
    while start < w.duration_s:
        t = start + rng.expovariate(burst_rate)
        while t < min(start + w.burst_s, w.duration_s):
            plan.append(_planned(rng, t, w.flood, w))
            t += rng.expovariate(burst_rate)
        start += w.period_s
    return plan


def noisy_schedule(w: Workload) -> list[Planned]:
    """Every arrival of a run: ``schedule``'s, plus the flood's when the workload has one, in time order."""
    return sorted([*schedule(w), *flood_schedule(w)], key=lambda p: p.at_s)


@dataclass
class Outcome:
    """What the client saw for one request (times relative to the run's start)."""

    model: str
    sent_s: float
    status: int = 0
    ttft_s: float | None = None
    done_s: float | None = None
    tokens: int = 0
    error: str = ""
    retry_after: str = ""  # the Retry-After header of a refusal
    sse_error: bool = False  # the stream carried an error event (vs. a broken connection)
    finished: bool = False  # the stream ended with ``data: [DONE]``
    backend: str = ""  # X-Lorapool-Backend, when the router adds it (--backend-header)


@dataclass
class RunResult:
    outcomes: list[Outcome] = field(default_factory=list)
    duration_s: float = 0.0
    late_starts: int = 0  # requests the generator itself sent > 5 ms late
    connections_opened: int = 0  # TCP connections the client opened (= ``connections`` when it held them)


async def _one(session: aiohttp.ClientSession, url: str, p: Planned, out: Outcome, t0: float, stream: bool) -> None:
    body = {
        "model": p.model,
        "prompt": p.prompt,
        "max_tokens": p.max_tokens,
        "ignore_eos": True,
        "stream": stream,
        "temperature": 0.0,
    }
    # vllm-router's consistent_hash keys on X-Tenant-ID: one tenant per adapter is its best use.
    headers = {"X-Tenant-ID": p.model}
    try:
        async with session.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
            out.status = resp.status
            out.backend = resp.headers.get("X-Lorapool-Backend", "")
            if resp.status != 200:
                out.retry_after = resp.headers.get("Retry-After", "")
                out.error = (await resp.text())[:200]
                out.done_s = time.perf_counter() - t0
                return
            if not stream:
                data = await resp.json()
                out.done_s = time.perf_counter() - t0
                out.ttft_s = out.done_s - out.sent_s
                out.tokens = int(data.get("usage", {}).get("completion_tokens", 0))
                return
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    if not event.startswith(b"data: "):
                        continue
                    data = event[6:]
                    if data == b"[DONE]":
                        out.finished = True
                        continue
                    parsed = json.loads(data)
                    if "error" in parsed:
                        out.error = str(parsed["error"])[:200]
                        out.sse_error = True
                        continue
                    if out.ttft_s is None:
                        out.ttft_s = time.perf_counter() - t0 - out.sent_s
                    out.tokens += 1
            out.done_s = time.perf_counter() - t0
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        out.error = repr(exc)[:200]
        out.done_s = time.perf_counter() - t0


async def run_open_loop(
    url: str,
    plan: Sequence[Planned],
    *,
    stream: bool = True,
    drain_timeout_s: float = 60.0,
    connections: int = 0,
) -> RunResult:
    """Send ``plan`` on schedule; wait up to ``drain_timeout_s`` after the last send.

    ``connections`` 0: a new connection whenever every open one is busy (aiohttp's pool). C > 0: exactly
    C keep-alive connections, request i on connection i mod C, as C clients each holding one long-lived
    connection (what an L4 front pins to one router). HTTP/1.1 has no pipelining, so a request waits
    for its connection's previous answer: the schedule is kept per connection only while they keep up.
    """
    if connections < 0:
        raise ValueError(f"connections={connections}: give 0 (a pool that grows) or the number to hold (>= 1)")
    result = RunResult()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=drain_timeout_s + 60)
    trace = aiohttp.TraceConfig()

    async def opened(*_: object) -> None:
        result.connections_opened += 1

    trace.on_connection_create_end.append(opened)
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=1 if connections else 0, force_close=False),
                    timeout=timeout,
                    trace_configs=[trace],
                )
            )
            for _ in range(max(1, connections))
        ]
        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter()
        for i, p in enumerate(plan):
            session = sessions[i % len(sessions)]
            delay = p.at_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.005:
                result.late_starts += 1
            out = Outcome(p.model, time.perf_counter() - t0)
            result.outcomes.append(out)
            tasks.append(asyncio.create_task(_one(session, url, p, out, t0, stream)))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for out in result.outcomes:
            if out.done_s is None and not out.error:
                out.error = "not finished within the drain timeout"
        result.duration_s = time.perf_counter() - t0
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summarize(result: RunResult, *, window_s: float, slo_ttft_s: float) -> dict[str, Any]:
    """Throughput and goodput over the send window, TTFT percentiles over completed requests.

    A request counts as good when it completed without error and its TTFT met the SLO;
    failed requests count as TTFT = infinity in the percentiles, so they cannot flatter.
    """
    outs = result.outcomes
    ok = [o for o in outs if o.status == 200 and not o.error and o.done_s is not None]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    ttfts_all = ttfts + [math.inf] * (len(outs) - len(ok))
    good = sum(1 for o in ok if o.ttft_s is not None and o.ttft_s <= slo_ttft_s)
    codes: dict[str, int] = {}
    for o in outs:
        key = str(o.status) if not o.error or o.status != 200 else "200-error"
        codes[key] = codes.get(key, 0) + 1
    return {
        "requests": len(outs),
        "completed": len(ok),
        "failed": len(outs) - len(ok),
        "throughput_rps": len(ok) / window_s,
        "goodput_rps": good / window_s,
        "ttft_p50_s": percentile(ttfts_all, 50),
        "ttft_p99_s": percentile(ttfts_all, 99),
        "tokens": sum(o.tokens for o in ok),
        "codes": codes,
        "late_starts": result.late_starts,
    }


def per_adapter(outcomes: Sequence[Outcome], *, window_s: float, slo_ttft_s: float) -> dict[str, dict[str, float]]:
    """Each adapter's requests, throughput, p99 TTFT (failures as infinity) and share within the SLO."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(o.model, []).append(o)
    out: dict[str, dict[str, float]] = {}
    for model, outs in sorted(by.items()):
        ok = [o for o in outs if o.status == 200 and not o.error and o.done_s is not None and o.ttft_s is not None]
        ttfts = [o.ttft_s for o in ok if o.ttft_s is not None] + [math.inf] * (len(outs) - len(ok))
        good = sum(1 for o in ok if o.ttft_s is not None and o.ttft_s <= slo_ttft_s)
        out[model] = {
            "requests": len(outs),
            "throughput_rps": len(ok) / window_s,
            "ttft_p99_s": percentile(ttfts, 99),
            "within_slo": good / len(outs),
        }
    return out


def workload_dict(w: Workload) -> dict[str, Any]:
    return asdict(w)
