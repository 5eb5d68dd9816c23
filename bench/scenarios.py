"""The benchmark matrix: regimes x arrival processes, and the systems compared on each.

All times in a scenario are simulated seconds; the runner stretches them by the simulator's
``--time-scale`` so that 2 cores can keep up, and converts the measurements back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.loadgen import Workload, adapter_name
from bench.systems import FleetSpec, System
from lorapool.api.common import RouterPolicy
from lorapool.router.core import registry
from lorapool.router.core.scorers.prefix import PREFIX_WEIGHT

TIME_SCALE = 4.0  # wall seconds per simulated second (see RESULTS.md, "How to read")
REPLICAS = 4
MAX_LORAS = 4
SLO_TTFT_S = 0.5


@dataclass(frozen=True)
class Scenario:
    name: str
    regime: str
    about: str
    fleet: FleetSpec
    workload: Workload
    warmup_s: float = 2.5
    slo_ttft_s: float = SLO_TTFT_S
    # adapter -> priority class, written to the --traffic-file of every lorapool system (regime f)
    priorities: tuple[tuple[str, str], ...] = ()
    # the systems it runs by default (``--systems`` still chooses); empty: every system
    systems: tuple[str, ...] = ()
    # keep-alive connections the load generator holds (0: as many as requests in flight; loadgen.run_open_loop)
    connections: int = 0
    # a pool rate limit on every adapter (requests per wall second, the router's clock), written to
    # the --traffic-file of every lorapool system with its number of routers; 0: none
    rate_limit_rps: float = 0.0


def _fleet(adapters: int, max_cpu_loras: int) -> FleetSpec:
    return FleetSpec(
        replicas=REPLICAS,
        adapters=adapters,
        max_loras=MAX_LORAS,
        max_cpu_loras=max_cpu_loras,
        time_scale=TIME_SCALE,
    )


def _work(adapters: int, rate: float, **kw: object) -> Workload:
    base = Workload(
        rate_rps=rate,
        duration_s=12.5,
        adapters=adapters,
        prompt_tokens=(64, 512),
        output_tokens=(16, 64),
        seed=7,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


# Regime (f), the noisy neighbour: 16 adapters = replicas x max-loras (as regime a), each sending
# an equal share of 24 req/s; in f-flood one of them also sends 10x its share in bursts (1 s in 4:
# 60 req/s more for a second), and one critical adapter has its 0.5 s TTFT SLO. The other
# arrivals are the same in both runs (loadgen.flood_schedule), so each adapter's p99 with and
# without the flood compare request for request.
# Issue 47's rows in (f) and (g): the EPP's two configs and our picker in that regime's best config.
F_PEERS = ("envoy + lorapool picker (fair)", "gie epp (lora-affinity)", "gie epp (default)")
G_PEERS = ("envoy + lorapool picker + prefix", "gie epp (lora-affinity)", "gie epp (default)")
F_ADAPTERS = 16
F_CRITICAL = adapter_name(0)
F_FLOOD = adapter_name(1)
F_RATE = 24.0
F_DURATION_S = 30.0


def _f_work(flood: str) -> Workload:
    return _work(F_ADAPTERS, F_RATE, duration_s=F_DURATION_S, flood=flood, flood_factor=10.0, seed=11)


def lorapool_system(policy: RouterPolicy) -> System:
    """``lorapool router --policy <policy>``, named "lorapool <policy>" in results."""
    return System(f"lorapool {policy}", "lorapool", str(policy))


LORAPOOL_AFFINITY = lorapool_system(RouterPolicy.AFFINITY).name
LORAPOOL_ROUND_ROBIN = lorapool_system(RouterPolicy.ROUND_ROBIN).name
# Issue 27: affinity with fair dispatch and the prefill cap (docs/traffic.md). The cap was chosen
# on f-flood (2, 4, 8 requests without a first token per replica, and an in-flight cap of 8 and
# 16, which cost goodput: bench/NOTES.md): 4 keeps about one full prefill step (2048 tokens of
# 64-256-token prompts) queued in each engine, so the engine never idles for the router's sake.
LORAPOOL_FAIR = "lorapool fair"
FAIR_MAX_PREFILLING = 4
CONSISTENT_HASH = "vllm-router consistent_hash"
CACHE_AWARE = "vllm-router cache_aware"
# Issue 28: affinity with the prefix scorer at the weight its flag gives alone (router/core/scorers/prefix.py).
LORAPOOL_PREFIX = "lorapool affinity + prefix"

# Regime (g), chat (bench/chat.py): sessions of 6 turns 2 s apart, each resending its history after
# its adapter's ~900-token system prompt (600 words of ~6 characters), a Zipf mix over 32 adapters
# on 4 replicas, so the hot adapters overflow bounded load onto several replicas, where the prefix
# cache decides what a turn costs.
G_WORK = dict(turns=6, think_s=2.0, system_prompt_words=600, prompt_tokens=(20, 60), output_tokens=(16, 64))

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "a-uniform-poisson",
        "a",
        "16 adapters = replicas x max-loras, uniform, Poisson 40 req/s",
        _fleet(16, 16),
        _work(16, 40.0),
    ),
    Scenario(
        "a-zipf-gamma",
        "a",
        "16 adapters, Zipf 1.0, bursty Gamma CV 3, 40 req/s",
        _fleet(16, 16),
        _work(16, 40.0, popularity="zipf", arrival="gamma", cv=3.0),
    ),
    Scenario(
        "b-zipf-poisson",
        "b",
        "256 adapters, Zipf 1.0, CPU cache 32/replica, Poisson 25 req/s",
        _fleet(256, 32),
        _work(256, 25.0, popularity="zipf"),
    ),
    Scenario(
        "b-zipf-gamma",
        "b",
        "256 adapters, Zipf 1.0, CPU cache 32/replica, Gamma CV 3, 25 req/s",
        _fleet(256, 32),
        _work(256, 25.0, popularity="zipf", arrival="gamma", cv=3.0),
    ),
    Scenario(
        "c-uniform-poisson",
        "c",
        "2000 adapters, uniform, CPU cache 64/replica, Poisson 12 req/s",
        _fleet(2000, 64),
        _work(2000, 12.0),
    ),
    Scenario(
        "d-hot-poisson",
        "d",
        "64 adapters, one takes 60 % of traffic (rest Zipf), Poisson 40 req/s",
        _fleet(64, 64),
        _work(64, 40.0, popularity="hot", hot_share=0.6),
    ),
    *(
        Scenario(
            name,
            "f",
            about,
            _fleet(F_ADAPTERS, F_ADAPTERS),
            _f_work(flood),
            priorities=((F_CRITICAL, "critical"),),
            systems=(LORAPOOL_FAIR, LORAPOOL_AFFINITY, LORAPOOL_ROUND_ROBIN, CONSISTENT_HASH, *F_PEERS),
        )
        for name, flood, about in (
            (
                "f-quiet",
                "",
                f"16 adapters, uniform, Poisson 24 req/s, {F_CRITICAL} critical (the run without the flood)",
            ),
            ("f-flood", F_FLOOD, f"as f-quiet, and {F_FLOOD} floods: 10x its share in 1-s bursts every 4 s"),
        )
    ),
    Scenario(
        "g-chat",
        "g",
        "32 adapters, Zipf 1.0, chat: 6-turn sessions 2 s apart after a ~900-token system prompt, 24 req/s",
        _fleet(32, 32),
        _work(32, 24.0, popularity="zipf", duration_s=30.0, seed=13, **G_WORK),
        systems=(LORAPOOL_PREFIX, LORAPOOL_AFFINITY, CACHE_AWARE, LORAPOOL_ROUND_ROBIN, *G_PEERS),
    ),
)


# The upper bound: every adapter always resident, loads free, same KV cache (systems.oracle_fleet);
# with nothing to group, spreading load is all that is left, so least-loaded routes it.
ORACLE = "oracle (adapters always resident)"
# Affinity with the hold rule issue 12 proposed (a request whose adapter runs nowhere is sent at
# once, not held): measured beside the default, a variant of affinity, not a baseline.
AFFINITY_HOLD_IF_ACTIVE = "lorapool affinity (hold-if-active)"
# Regime (e) (bench/large_catalog.py): affinity routing plus the operator's k-of-N placement, the
# product itself, not a baseline.
LORAPOOL_PLACEMENT = "lorapool placement"
# Issue 24: the same affinity policy as a GIE endpoint picker behind a real Envoy (the product's
# second front door, not a baseline): Envoy carries the bytes, the picker decides.
ENVOY_PICKER = "envoy + lorapool picker"
# The picker's floors, in the overhead cell only: Envoy alone, and Envoy asking an ext_proc server
# that picks without a policy (bench/noop_ext_proc.py).
ENVOY_ALONE = "envoy round-robin"
ENVOY_NOOP = "envoy + no-op ext_proc"
# Issue 47: the GIE endpoint picker v1.5.0 (lorapool_dev/peer.py) behind the same Envoy, a peer rather
# than a baseline: its built-in default config (queue 2, kv-cache 2, prefix 3; no LoRA scorer) and
# that config plus its lora-affinity-scorer, whose weight (none is recommended) came from a sweep on
# regime (a) (bench/NOTES.md, "The GIE endpoint picker"). Our side of the comparison runs the picker
# in each regime's best documented config: fair dispatch in (f), the prefix scorer in (g).
GIE_EPP_LORA = "gie epp (lora-affinity)"
GIE_EPP_DEFAULT = "gie epp (default)"
EPP_LORA_WEIGHT = 3.0
EPP_SWEEP_WEIGHTS = (1.0, 3.0, 10.0)
ENVOY_PICKER_FAIR = "envoy + lorapool picker (fair)"
ENVOY_PICKER_PREFIX = "envoy + lorapool picker + prefix"
GIE_EPPS = (GIE_EPP_LORA, GIE_EPP_DEFAULT)
# regime -> our picker's system for the peer comparison (every other regime: ENVOY_PICKER)
OUR_PICKER = {"f": ENVOY_PICKER_FAIR, "g": ENVOY_PICKER_PREFIX}
NOT_BASELINES: tuple[str, ...] = (
    LORAPOOL_AFFINITY, ORACLE, AFFINITY_HOLD_IF_ACTIVE, LORAPOOL_PLACEMENT, ENVOY_PICKER, LORAPOOL_FAIR, LORAPOOL_PREFIX,
    ENVOY_PICKER_FAIR, ENVOY_PICKER_PREFIX, *GIE_EPPS,
)  # fmt: skip

FAIR_ARGS = ("--fair-dispatch", "--max-prefilling", str(FAIR_MAX_PREFILLING))
PREFIX_ARGS = ("--prefix-weight", f"{PREFIX_WEIGHT:g}")
SYSTEMS: tuple[System, ...] = (
    *(lorapool_system(policy) for policy in registry.POLICIES),  # every --policy the router has
    System(ORACLE, "lorapool", str(RouterPolicy.LEAST_LOADED), oracle=True),
    System(AFFINITY_HOLD_IF_ACTIVE, "lorapool", str(RouterPolicy.AFFINITY), ("--hold-rule", "hold-if-active")),
    System(ENVOY_PICKER, "envoy-picker", str(RouterPolicy.AFFINITY)),
    System(LORAPOOL_FAIR, "lorapool", str(RouterPolicy.AFFINITY), FAIR_ARGS),
    System(LORAPOOL_PREFIX, "lorapool", str(RouterPolicy.AFFINITY), PREFIX_ARGS),
    System("nginx round-robin", "nginx"),
    System("vllm-router round_robin", "vllm-router", "round_robin"),
    System("vllm-router power_of_two", "vllm-router", "power_of_two"),
    System(CACHE_AWARE, "vllm-router", "cache_aware"),
    System(CONSISTENT_HASH, "vllm-router", "consistent_hash"),
    System(GIE_EPP_LORA, "gie-epp", f"{EPP_LORA_WEIGHT:g}"),
    System(GIE_EPP_DEFAULT, "gie-epp"),
    System(ENVOY_PICKER_FAIR, "envoy-picker", str(RouterPolicy.AFFINITY), FAIR_ARGS),
    System(ENVOY_PICKER_PREFIX, "envoy-picker", str(RouterPolicy.AFFINITY), PREFIX_ARGS),
)


# Regime (h), issue 43: N routers, each with its own books (today's code), over the same replicas.
# The HTTP router's N behind nginx round robin per request; the picker's N as Envoy's ext_proc
# cluster (round robin per gRPC stream, one per request). x1 is the ordinary system.
def several(name: str, routers: int) -> str:
    """The name of ``name`` run as ``routers`` routers (or pickers): "lorapool affinity x3"."""
    return f"{name} x{routers}"


def shared(name: str) -> str:
    """The name of ``name`` (N routers) with shared books, one store for the run: "lorapool affinity x3 shared"."""
    return f"{name} shared"


H_COUNTS = (2, 3)
# Each (h) cell runs x1, x3 with its own books (the "before") and x3 with shared books, for both doors;
# x2 and x2 shared run when --systems names them (a 6-system cell is ~10 min already).
H_SYSTEMS = tuple(n for door in (LORAPOOL_AFFINITY, ENVOY_PICKER)
                  for n in (door, several(door, 3), shared(several(door, 3))))  # fmt: skip
# The rate-limit cell: an L4 front (nginx stream {}, round robin per TCP connection, as a Kubernetes
# Service pins a client's connection to one router pod) over 1 and 3 routers, and 3 with shared books
# (whose traffic file says 3 routers, as the operator writes it: the routers split the limit by demand).
L4 = " (L4 front)"
H_RATE_SYSTEMS = (
    LORAPOOL_AFFINITY + L4,
    several(LORAPOOL_AFFINITY, 3) + L4,
    shared(several(LORAPOOL_AFFINITY, 3)) + L4,
)
# Regime (f)'s flood cell with 3 routers: fair dispatch alone, 3 with their own books and 3 sharing them.
H_FLOOD = "h-f-flood"
H_FAIR_SYSTEMS = (LORAPOOL_FAIR, several(LORAPOOL_FAIR, 3), shared(several(LORAPOOL_FAIR, 3)))
# The overhead cell's router with shared books: a store on 127.0.0.1 and a second, idle router sharing them.
SHARED_BOOKS_ROUTER = "lorapool affinity (shared books)"
H_RATE_LIMIT_RPS = 8.0
H_RATE_CONNECTIONS = (1, 100)
# The headline cells of regimes (a) and (b) (RESULTS.md's "Router II" check: the cells issue 42 re-ran),
# the workload unchanged; regime (e)'s is bench/run.py's ``H_CATALOG`` (large_catalog.py's cell).
H_OF = ("a-uniform-poisson", "a-zipf-gamma", "b-zipf-poisson")


def h_scenarios(scenarios: tuple[Scenario, ...]) -> tuple[Scenario, ...]:
    """Regime (h): the headline cells as ``h-<name>``, same fleet and schedule, run with x1, x3 and x3 shared
    of both doors; then the rate-limit cell with 1 and 100 client connections; then regime (f)'s flood
    cell with 1 and 3 fair-dispatch routers. Pure."""
    by_name = {s.name: s for s in scenarios}
    cells = tuple(
        replace(by_name[n], name=f"h-{n}", regime="h", about=f"{by_name[n].about}; as {n}", systems=H_SYSTEMS)
        for n in H_OF
    )
    # One adapter offered 3x its pool limit at time scale 1 (the limit is on the routers' wall clock),
    # short answers so that one connection keeps up; 2 replicas with a slot each.
    rate = Scenario(
        "h-rate-limit",
        "h",
        f"1 adapter limited to {H_RATE_LIMIT_RPS:g} req/s for the pool, Poisson {3 * H_RATE_LIMIT_RPS:g} req/s",
        FleetSpec(replicas=2, adapters=1, max_loras=1, max_cpu_loras=1, time_scale=1.0),
        _work(1, 3 * H_RATE_LIMIT_RPS, duration_s=20.0, prompt_tokens=(16, 48), output_tokens=(2, 4), seed=17),
        systems=H_RATE_SYSTEMS,
        rate_limit_rps=H_RATE_LIMIT_RPS,
    )
    limits = tuple(
        replace(
            rate, name=f"h-rate-limit-c{c}", about=f"{rate.about}, over {c} keep-alive connection(s)", connections=c
        )
        for c in H_RATE_CONNECTIONS
    )
    flood = by_name["f-flood"]
    fair = replace(flood, name=H_FLOOD, regime="h", about=f"{flood.about}; as f-flood", systems=H_FAIR_SYSTEMS)
    return (*cells, *limits, fair)


# Run only when --only names them (bench/run.py): issue 43's measurement, not part of the full matrix.
H_SCENARIOS = h_scenarios(SCENARIOS)
SYSTEMS += (
    *(replace(s, name=several(s.name, n), routers=n) for s in SYSTEMS if s.name in (LORAPOOL_AFFINITY, ENVOY_PICKER)
      for n in H_COUNTS),
    *(replace(s, name=shared(several(s.name, n)), routers=n, shared_books=True) for s in SYSTEMS
      if s.name in (LORAPOOL_AFFINITY, ENVOY_PICKER) for n in H_COUNTS),
    *(replace(s, name=name, routers=3, shared_books=books) for s in SYSTEMS if s.name == LORAPOOL_FAIR
      for name, books in zip(H_FAIR_SYSTEMS[1:], (False, True), strict=True)),
    replace(lorapool_system(RouterPolicy.AFFINITY), name=H_RATE_SYSTEMS[0], front="l4"),
    replace(lorapool_system(RouterPolicy.AFFINITY), name=H_RATE_SYSTEMS[1], routers=3, front="l4"),
    replace(lorapool_system(RouterPolicy.AFFINITY), name=H_RATE_SYSTEMS[2], routers=3, front="l4", shared_books=True),
)  # fmt: skip
# Regime (h)'s own systems: measured in its cells only (bench/run.py), never a baseline.
H_ONLY = (*(m(several(n, c)) for n in (LORAPOOL_AFFINITY, ENVOY_PICKER) for c in H_COUNTS for m in (str, shared)),
          *H_RATE_SYSTEMS, *H_FAIR_SYSTEMS[1:])  # fmt: skip
NOT_BASELINES += H_ONLY

# Run only when --systems names them: the lora-affinity weight sweep (bench/NOTES.md).
EXTRA_SYSTEMS: tuple[System, ...] = tuple(
    System(f"gie epp (lora-affinity weight {w:g})", "gie-epp", f"{w:g}") for w in EPP_SWEEP_WEIGHTS
)
