"""Router settings: one documented dataclass, filled by ``cli`` (flags) or by tests."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from lorapool.api.common import RouterPolicy
from lorapool.router.core.document import Overrides, SchedulerKnobs
from lorapool.router.core.plugin import DEFAULT_LOAD_FACTOR, DEFAULT_LOAD_SLACK, PolicyParams
from lorapool.router.core.scorers.prefix import PREFIX_WEIGHT

MIB = 1024 * 1024

# The flags that feed the policy document: ``Overrides`` field -> ``RouterSettings`` field.
DOCUMENT_FLAGS = {
    "policy": "policy",
    "load_factor": "load_factor",
    "load_slack": "load_slack",
    "hold_rule": "hold_rule",
    "prefix_weight": "prefix_weight",
    "fair_dispatch": "fair_dispatch",
    "max_prefilling": "max_prefilling",
    "max_inflight": "max_inflight",
    "max_queue_wait": "max_queue_wait_s",
    "max_wait": "max_wait_s",
    "max_loras": "max_loras",
    "max_cpu_loras": "max_cpu_loras",
}


@dataclass(frozen=True)
class RouterSettings:
    """Every knob of the router, with its unit and why it has its default."""

    host: str = "127.0.0.1"
    port: int = 8080
    # Static backend base URLs (local use); empty when EndpointSlices are watched.
    backends: tuple[str, ...] = ()
    # NAMESPACE/SERVICE whose EndpointSlices list the backends (in cluster).
    endpointslices: str | None = None
    # EndpointSlice port name to use; None picks the only port, else "http", else the first.
    port_name: str | None = None
    # NAMESPACE/LABEL_SELECTOR of the pool's engine Pods, whose sidecars' reports say what each
    # engine holds (docs/status.md); None: no reports, /v1/models alone decides (local use).
    report_pods: str | None = None
    # NAMESPACE/NAME of the pool's adapter-set index ConfigMap, read and watched through the API: an
    # adapter it names is held while it loads (503 with Retry-After at the wait's end), never a 404.
    adapters_configmap: str | None = None
    # Static backends' pods (URL -> pod name) for their reports; EndpointSlices name their own
    # (targetRef), and a backend not named either way is matched by pod IP.
    backend_pods: tuple[tuple[str, str], ...] = ()
    # The pool's router policy document (api.routerpolicy: profiles, weights, plugin parameters; the
    # operator mounts the <pool>-router-policy ConfigMap), re-read every poll interval; None: the
    # policy flags below describe the policy (docs/router-policy.md).
    policy_file: str | None = None
    # The flags that feed the policy document (settings field names, DOCUMENT_FLAGS' values: the
    # policy flags, the dispatch flags, max_wait_s, max_loras, max_cpu_loras) given on the command
    # line: with policy_file, each replaces the document's matching knob and the others come from
    # the document; without it, every one counts.
    policy_flags: tuple[str, ...] = ()
    # A name in registry.POLICIES (--policy).
    policy: str = RouterPolicy.AFFINITY.value
    # Bounded-load cap as a multiple of the mean load (1.25 as in KubeAI / CH-BL).
    load_factor: float = DEFAULT_LOAD_FACTOR
    # Bounded-load slack: a backend may also run this many requests above the mean before a
    # hot adapter spreads (filters/bounded_load.py says why). Small: prefill cost grows with
    # every request a replica takes, so large gaps hurt TTFT (bench/ regime d).
    load_slack: float = DEFAULT_LOAD_SLACK
    # A hold rule (registry.HOLDS) instead of the policy's own; "" keeps the policy's.
    hold_rule: str = ""
    # The affinity policy's prefix scorer weight (core/scorers/prefix.py: prefix-cache locality
    # among an adapter's replicas); 0: off, the policy is the one without it. Off until measured;
    # 1.5 (the flag alone) sits between least-load's 1 and lora-affinity's level gap of 2.
    prefix_weight: float = 0.0
    # GPU slots assumed until a backend reports vllm:lora_requests_info{max_lora} (vLLM's default).
    max_loras: int = 1
    # vLLM --max-cpu-loras of the replicas, if known: lets the policy prefer CPU-cached adapters.
    max_cpu_loras: int | None = None
    # Longest a request waits in the router, seconds: for a LoRA slot (then it is sent best-effort)
    # or for its adapter to finish loading on the engines (then 503 with Retry-After). About one
    # short generation: long enough for a slot to free, short next to a disk load storm.
    max_wait_s: float = 2.0
    # The pool's traffic document (api.traffic: priorities, rate limits; the operator mounts the
    # <pool>-traffic ConfigMap), re-read every poll interval; None: every adapter standard, unlimited.
    traffic_file: str | None = None
    # Longest a request waits because every replica is at its --max-inflight or --max-prefilling, seconds; then it is
    # sent best effort. Longer than --max-wait: sending it over the cap would not serve it sooner
    # (the engines are full), only move the queue into them, where nothing orders it any more.
    max_queue_wait_s: float = 30.0
    # Requests each backend may run at once (router's own plus foreign); above it requests wait in
    # the router (Hold(saturated), filters/saturation.py), so the router orders them; 0: no cap.
    max_inflight: int = 0
    # Requests each backend may hold that have not streamed a first token yet (the router's own);
    # above it requests wait in the router (Hold(saturated)) like above --max-inflight. The
    # engine's prefill queue is first come first served: capping it, not the running batch,
    # keeps the queue in the router, where fair dispatch orders it, while decode batches still
    # grow as large as the engine lets them. Responses the router does not see (a gateway that
    # sends no response body to the picker) count until they end. 0: no cap.
    max_prefilling: int = 0
    # Held requests bind by fair dispatch's virtual token counters (core.fairness), weighted by
    # class, instead of class then age. Off until regime (f) measured it.
    fair_dispatch: bool = False
    # Requests held in all wait queues together before new ones get 429.
    max_queued: int = 4096
    # Largest request body accepted, bytes (4 MiB: far above any prompt the engines accept).
    max_body_bytes: int = 4 * MIB
    # How often each backend's /metrics and /v1/models are read, seconds.
    poll_interval_s: float = 1.0
    # A poll slower than this counts as failed, seconds.
    poll_timeout_s: float = 2.0
    # Consecutive failed polls (not connection refusals, which count at once) before "down".
    poll_failures_down: int = 3
    # Time to open a connection to a backend before trying another, seconds.
    connect_timeout_s: float = 2.0
    # Longest silence from a backend mid-response (no next byte), seconds.
    read_timeout_s: float = 600.0
    # A request bound to a backend that left the pool's endpoints (its pod is stopping) waits this
    # long for its first byte, then is retried elsewhere: the engines drain for 30 s on SIGTERM
    # (render.engine.DRAIN_S), so only an engine that hangs past its own drain loses its requests here.
    departed_grace_s: float = 30.0
    # Retry-After sent with 429 and 503, seconds.
    retry_after_s: int = 1
    # Distinct model label values in the router's metrics; the rest are counted as "other".
    max_model_labels: int = 100
    # Add an X-Lorapool-Backend response header naming the backend (debugging, tests).
    backend_header: bool = False
    # Requests are counted per adapter over windows of this length, seconds (GET /lorapool/requests,
    # the annotation lorapool.io/requests): 60 as the sidecars' observation window, so placement
    # reads rates and engine observations over the same span.
    requests_window_s: float = 60.0
    # NAMESPACE/NAME of the router's own Pod: each closed window is written on it (annotation
    # lorapool.io/requests) for the operator's placement; None: only GET /lorapool/requests.
    pod: str | None = None
    # The endpoint picker (GIE's protocol over Envoy ext_proc, router/picker/): its gRPC port,
    # None: off. TLS by default (the Secret's pair, else self-signed), plaintext with insecure.
    ext_proc_port: int | None = None
    # Plaintext gRPC health (liveness, readiness, the ext_proc service) on its own port; None: off.
    ext_proc_health_port: int | None = None
    ext_proc_tls_cert: str | None = None
    ext_proc_tls_key: str | None = None
    ext_proc_insecure: bool = False
    # The gateway's ext_proc message_timeout, seconds: a hold ends before it (Envoy's default 0.2 s;
    # a gateway that groups sets it above --max-wait and tells the picker the same).
    ext_proc_message_timeout_s: float = 0.2
    # Fallback endpoints listed after the pick (comma-separated): for gateways whose load
    # balancer reads the list; 0 for Envoy's ORIGINAL_DST cluster, which takes one address.
    ext_proc_fallbacks: int = 0
    # Several routers' shared books (router.sharedbooks): a Redis-protocol store's URL,
    # redis://[USER:PASSWORD@]HOST[:PORT][/DB] or rediss://; None: this router's own books only.
    shared_state: str | None = None
    # The pool's identity in the store's keys (the operator renders the pool's UID): one store, many pools.
    shared_state_key: str = "default"
    # How often the books are written even when unchanged, and the store's entries re-read, seconds;
    # an entry lives 4 of them (sharedbooks.TTL_INTERVALS): a dead router's claims go after that.
    shared_state_interval_s: float = 0.5
    # A store call slower than this counts as failed: the store is "down" until one succeeds, seconds.
    shared_state_deadline_s: float = 0.2

    def __post_init__(self) -> None:
        if not (self.requests_window_s > 0 and math.isfinite(self.requests_window_s)):
            raise ValueError(f"--requests-window-s must be > 0 seconds (and finite), got {self.requests_window_s:g}")
        if not (self.ext_proc_message_timeout_s > 0 and math.isfinite(self.ext_proc_message_timeout_s)):
            got = self.ext_proc_message_timeout_s
            raise ValueError(
                f"--ext-proc-message-timeout must be > 0 seconds (the gateway's message_timeout), got {got:g}"
            )
        if not (self.max_queue_wait_s > 0 and math.isfinite(self.max_queue_wait_s)):
            raise ValueError(f"--max-queue-wait must be > 0 seconds (and finite), got {self.max_queue_wait_s:g}")
        if self.max_inflight < 0:
            raise ValueError(f"--max-inflight must be >= 0 requests (0: no cap), got {self.max_inflight}")
        if self.max_prefilling < 0:
            raise ValueError(f"--max-prefilling must be >= 0 requests (0: no cap), got {self.max_prefilling}")
        if self.ext_proc_fallbacks < 0:
            raise ValueError(f"--ext-proc-fallbacks must be >= 0, got {self.ext_proc_fallbacks}")
        self._check_prefix_weight()
        self._check_shared_state()

    def _check_shared_state(self) -> None:
        if self.shared_state is not None:
            parts = urlsplit(self.shared_state)
            try:
                port = parts.port
            except ValueError:
                port = -1
            db = parts.path.strip("/")
            if (
                parts.scheme not in ("redis", "rediss")
                or not parts.hostname
                or port == -1
                or not (db == "" or db.isdigit())
            ):
                raise ValueError(
                    "--shared-state must be redis://HOST[:PORT][/DB] or rediss://HOST[:PORT][/DB] (a Redis or Valkey"
                    f" store), got {parts.scheme or '(no scheme)'}://{parts.hostname or '(no host)'}..."
                )
        if not self.shared_state_key or any(c in self.shared_state_key for c in "{}\r\n "):
            raise ValueError(
                f"--shared-state-key must be a non-empty name without braces or spaces, got {self.shared_state_key!r}"
            )
        for flag, value in (("interval", self.shared_state_interval_s), ("deadline", self.shared_state_deadline_s)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"--shared-state-{flag} must be > 0 seconds (and finite), got {value:g}")

    def _check_prefix_weight(self) -> None:
        weight = self.prefix_weight
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(
                f"--prefix-weight must be a finite weight >= 0 (0: off; {PREFIX_WEIGHT:g} keeps prefix locality"
                f" under lora-affinity's levels), got {weight:g}"
            )
        if weight > 0 and self.policy != RouterPolicy.AFFINITY:
            raise ValueError(
                f"--prefix-weight applies to --policy affinity, not {self.policy}"
                " (the least-loaded and round-robin baselines stay prompt-blind); drop the flag or use affinity"
            )

    def policy_overrides(self) -> Overrides:
        """The flags that feed the document: all of them without ``--policy-file`` (their defaults
        left out, so the flags' document stays minimal; ``--policy`` always), else those given explicitly."""
        defaults = {f.name: f.default for f in fields(self)}
        given = set(self.policy_flags)
        values: dict[str, object] = {}
        for knob, name in DOCUMENT_FLAGS.items():
            value = getattr(self, name)
            keep = (name == "policy" or value != defaults[name]) if self.policy_file is None else name in given
            values[knob] = value if keep and value != "" else None  # hold_rule "": the policy's own
        return Overrides(**values)  # type: ignore[arg-type]

    def knobs(self) -> SchedulerKnobs:
        """The scheduler's dispatch knobs and slots as the flags alone set them (no document)."""
        return SchedulerKnobs(
            fair=self.fair_dispatch,
            max_prefilling=self.max_prefilling,
            max_inflight=self.max_inflight,
            max_queue_wait_s=self.max_queue_wait_s,
            max_wait_s=self.max_wait_s,
            max_loras=self.max_loras,
            max_cpu_loras=self.max_cpu_loras,
        )

    def policy_params(self) -> PolicyParams:
        """The knobs the policy's plugin factories read."""
        return PolicyParams(
            load_factor=self.load_factor,
            load_slack=self.load_slack,
            hold_rule=self.hold_rule,
            prefix_weight=self.prefix_weight,
        )
