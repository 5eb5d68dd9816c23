"""`lorapool dev`: the local playground, on one machine, without Docker.

Starts the local control plane (fake A100 nodes), installs the CRDs and the operator's
RBAC, runs the operator as its own ServiceAccount, applies a pool (default
``examples/lorapool.yaml``), waits until it is Ready and prints what happened: the
objects, the plan and the nodes the engine pods landed on.

The fake nodes run no containers, so the data plane runs beside it as local processes,
as a kubelet would run them: for every engine pod (a real API object) one `lorapool sim`
with the pool's derived flags and an adapter-sync sidecar that follows the pool's
ConfigMap as the kubelet projects it and reports on that Pod with the engine
ServiceAccount's token (``lorapool_dev.testing.fakekubelet``); `lorapool router` in front, routing
by those reports as in a cluster (its ServiceAccount's token, ``--backend-pod`` per engine).
Adapter sources the machine cannot reach (hf://, s3://, https://) are replaced by local
PEFT adapters of the same rank before the pool is applied. It then sends an OpenAI
request for the first adapter through the router and prints the answer, writes the
router's URL to ``<dir>/router-url`` and a LoRAAdapter to try to ``<dir>/adapter.yaml``.
With ``--gateway envoy`` the same request also goes through a real Envoy and the router's endpoint
picker (``lorapool_dev.dev.gateway``), whose URL is written to ``<dir>/gateway-url``.
`kubectl apply` of an adapter is served within seconds; `kubectl delete` makes it 404.

SIGTERM, SIGINT and SIGHUP all stop everything it started (also when a script started
it in the background, where SIGINT is ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, cast

DEFAULT_DIR = Path(os.environ.get("LORAPOOL_CACHE", "~/.cache/lorapool")).expanduser() / "dev"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        type=Path,
        default=None,
        help="pool YAML to apply (default: the bundled examples/lorapool.yaml)",
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})")
    parser.add_argument("--once", action="store_true", help="print the result and stop everything (no Ctrl-C wait)")
    parser.add_argument("--no-data-plane", action="store_true", help="skip the local sim/sidecar/router processes")
    parser.add_argument("--timeout-seconds", type=float, default=180.0, help="how long to wait for Ready")
    parser.add_argument(
        "--node",
        choices=("kwok", "real"),
        default="kwok",
        help="kwok: fake nodes, the data plane as local processes (default); real: a real kubelet node"
        " in a network namespace of its own, every component a pod (root, containerd)",
    )
    parser.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default="sim",
        help="sim: lorapool sim per engine pod (default); vllm: real vLLM CPU replicas of a tiny stand-in model"
        " (installs the engine on first use)",
    )
    parser.add_argument(
        "--gateway",
        choices=("envoy",),
        default=None,
        help="envoy: open the pool's gateway door (frontDoor both), install the InferencePool CRD and put a real"
        " Envoy, configured as a GIE gateway for the rendered InferencePool, in front of the picker (docs/gateway.md)",
    )


def _example() -> str:
    repo_example = Path(__file__).resolve().parents[3] / "examples" / "lorapool.yaml"
    if repo_example.exists():
        return repo_example.read_text()
    return resources.files("lorapool").joinpath("examples/lorapool.yaml").read_text()


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


class _Stopped(BaseException):
    """A stop signal arrived: unwind through every ``finally`` so nothing is left running."""


def _stop_on_signals() -> None:
    def stop(signum: int, _frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # one stop is enough: let the cleanup finish
        raise _Stopped(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)


def run(args: argparse.Namespace) -> int:
    _stop_on_signals()
    try:
        return _run(args)
    except _Stopped as stopped:
        _say(f"Stopped ({stopped}); everything it started is gone")
        return 0


def _run(args: argparse.Namespace) -> int:
    from lorapool.api.load import parse_object
    from lorapool_dev.cluster import build
    from lorapool_dev.cluster.runtime import LocalCluster

    state = args.dir.expanduser()
    state.mkdir(parents=True, exist_ok=True)
    for stale in ("router-url", "gateway-url"):
        (state / stale).unlink(missing_ok=True)
    if getattr(args, "node", "kwok") == "real":
        return _run_on_real_node(args)
    pool_doc, text, start_engine = _playground_manifests(args, state)
    pool = parse_object(pool_doc)
    ns, name = pool.metadata.namespace, pool.metadata.name
    stack: list[Any] = []  # everything to stop, in start order

    _say("Building the control plane if needed (first run only: ~25 min, cached in ~/.cache/lorapool)")
    build.ensure_built()
    cluster = LocalCluster(state / "cluster", kubeconfig=state / "kubeconfig", timeout_s=180)
    _say("Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK fake GPU nodes")
    try:
        cluster.start()
        _start_operator(cluster, ns, stack, gateway=bool(args.gateway))
        _say(f"Applying LoRAPool {ns}/{name}")
        cluster.kubectl("apply", "-f", "-", input_text=text)
        pool_json = _wait_ready(cluster, ns, name, args.timeout_seconds)
        _report(cluster, pool_json, ns, name)
        if not args.no_data_plane:
            _data_plane(cluster, pool_json, state, stack, start_engine=start_engine, gateway=bool(args.gateway))
        if args.once:
            return 0
        print(f"\nPlayground running. KUBECONFIG={cluster.kubeconfig}  Ctrl-C or SIGTERM stops it.", flush=True)
        while True:
            time.sleep(3600)
    finally:
        for item in reversed(stack):
            (item.stop if hasattr(item, "stop") else item.close)()
        cluster.stop()
        for url_file in ("router-url", "gateway-url"):
            (state / url_file).unlink(missing_ok=True)


def _run_on_real_node(args: argparse.Namespace) -> int:
    import yaml

    from lorapool_dev.cluster.node import missing_prerequisites
    from lorapool_dev.dev.node import run_real

    if args.engine != "sim" or args.no_data_plane:
        raise SystemExit("lorapool dev: --node real runs the sim image as the engine; drop --engine/--no-data-plane")
    if problems := missing_prerequisites():
        raise SystemExit(f"lorapool dev: --node real cannot run here: {'; '.join(problems)}")
    text = args.filename.read_text() if args.filename else _example()
    pool_doc = next(d for d in yaml.safe_load_all(text) if d and d.get("kind") == "LoRAPool")
    return run_real(args, pool_doc, _say)


def _playground_manifests(args: argparse.Namespace, state: Path) -> tuple[dict[str, Any], str, Any]:
    """The LoRAPool to apply (the file given, else the example), its sources made local, as YAML text.

    Apart from ``_run`` because it decides what runs before anything starts: with ``--engine vllm``
    the tiny model's adapters replace the remote ones, and the returned ``start_engine`` launches it."""
    import yaml

    text = args.filename.read_text() if args.filename else _example()
    docs = [d for d in yaml.safe_load_all(text) if d]
    pool_doc = next(d for d in docs if d.get("kind") == "LoRAPool")
    start_engine = None
    if getattr(args, "engine", "sim") == "vllm" and not args.no_data_plane:
        from lorapool_dev.engine.playground import prepare_real_engine

        start_engine = prepare_real_engine(pool_doc, state, say=_say)  # tiny-model adapters replace remote ones
    if getattr(args, "gateway", None):
        from lorapool_dev.dev.gateway import gateway_pool

        gateway_pool(pool_doc)
    _local_sources(pool_doc, state)
    return pool_doc, yaml.safe_dump_all(docs, sort_keys=False), start_engine


def _start_operator(cluster: Any, ns: str, stack: list[Any], *, gateway: bool = False) -> None:
    """CRDs, namespaces and RBAC as the chart installs them, then the operator as its ServiceAccount.
    ``gateway``: the InferencePool CRD too (``lorapool_dev.testing.inferencepool_crd``), as GIE installs it.

    Apart from ``_run`` so the playground's operator is set up in one place, the way a cluster has
    it; the process joins ``stack`` as soon as it runs."""
    from lorapool_dev.testing.components import operator_argv
    from lorapool_dev.testing.processes import free_port, start_process

    repo = Path(__file__).resolve().parents[3]
    cluster.kubectl("apply", "--server-side", "-f", str(repo / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/lorapools.lorapool.io")
    if gateway:
        import yaml

        from lorapool_dev.testing.inferencepool_crd import NAME, inferencepool_crd

        cluster.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump(inferencepool_crd()))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{NAME}")
    for namespace in ("lorapool-system", ns):
        cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.kubectl("apply", "-f", str(repo / "deploy" / "rbac.yaml"))
    sa_kubeconfig = cluster.service_account_kubeconfig("lorapool-system", "lorapool-operator")
    _say("Running the operator as ServiceAccount lorapool-system/lorapool-operator")
    metrics, liveness = free_port(), free_port()
    argv = operator_argv(
        kubeconfig=sa_kubeconfig,
        metrics_port=metrics,
        liveness_port=liveness,
        extra=["--metadata-timeout-seconds", "3", "--resync-seconds", "30"],
    )
    stack.append(start_process(argv, f"http://127.0.0.1:{liveness}/readyz", timeout=60))


def _local_sources(pool_doc: dict[str, Any], state: Path) -> None:
    """Replace adapter sources this machine cannot reach by local PEFT adapters of the same rank."""
    from lorapool_dev.testing.peft import base_module_shapes, write_peft_adapter

    base = pool_doc["spec"]["baseModel"]["name"]
    shapes = base_module_shapes(base)  # the base's own shapes: the sidecars verify every adapter against them
    for adapter in pool_doc["spec"].get("adapters") or []:
        if adapter["source"].startswith(("file://", "pvc://")):
            continue
        rank = int(adapter.get("rank") or 8)
        path = write_peft_adapter(
            state / "adapters-src" / adapter["name"], rank=rank, base_model=base, module_shapes=shapes
        )
        _say(f"Serving a local PEFT copy of {adapter['name']} (rank {rank}) instead of {adapter['source']}")
        adapter["source"] = f"file://{path}"


def _wait_ready(cluster: Any, ns: str, name: str, timeout_s: float) -> dict[str, Any]:
    from lorapool_dev.testing.wait import WaitTimeout, wait_until

    said = {"message": ""}

    def ready() -> dict[str, Any] | None:
        result = cluster.kubectl("get", "lorapool", name, "-n", ns, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        pool = json.loads(result.stdout)
        cond: dict[str, Any] = next(
            (c for c in pool.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
        )
        if cond.get("status") == "True":
            return dict(pool)
        if cond.get("message") and cond["message"] != said["message"]:
            said["message"] = cond["message"]
            _say(f"Waiting: {cond.get('reason')}: {cond['message']}")
        return None

    try:
        return wait_until(f"{ns}/{name} Ready", ready, timeout_s, interval_s=0.5, max_interval_s=1.0)
    except WaitTimeout:
        raise SystemExit(f"lorapool dev: {ns}/{name} was not Ready after {timeout_s:.0f}s: {said['message']}") from None


def _report(cluster: Any, pool: dict[str, Any], ns: str, name: str) -> None:
    status = pool["status"]
    plan = status["plan"]
    print()
    print(cluster.kubectl("get", "lorapool", name, "-n", ns, "-o", "wide").stdout)
    print(
        cluster.kubectl("get", "deployments,services,configmaps,pdb", "-n", ns, "-l", f"lorapool.io/pool={name}").stdout
    )
    print("Plan (status.plan):")
    for flag, key in (
        ("--max-loras", "maxLoras"),
        ("--max-lora-rank", "maxLoraRank"),
        ("--max-cpu-loras", "maxCpuLoras"),
    ):
        print(f"  {flag:<16} {plan[key]:<6} {plan['reasons'][key]}")
    m = plan["memory"]
    print(
        f"  KV cache: {m['kvCacheBytes'] / 1e9:.1f} GB = {m['kvCacheTokens']:,} tokens; LoRA buffers "
        f"{m['loraBytes'] / 1e9:.1f} GB (naive rank 256: {m['naiveLoraBytes'] / 1e9:.1f} GB)"
    )
    print("\nEngine pods and their nodes:")
    print(
        cluster.kubectl(
            "get", "pods", "-n", ns, "-l", f"lorapool.io/pool={name}", "-o", "wide", "-L", "app.kubernetes.io/component"
        ).stdout
    )
    print("Adapters:")
    for adapter in status.get("adapters", []):
        print(
            f"  {adapter['name']:<20} rank {adapter.get('rank')!s:<4} {adapter['phase']:<8} {adapter.get('message', '')}"
        )
    if status.get("endpoint"):
        print(f"\nEndpoint in the cluster: {status['endpoint']}")
    if status.get("inferencePool"):
        print(f"InferencePool for a Gateway's HTTPRoute: {status['inferencePool']}")


def _data_plane(
    cluster: Any,
    pool: dict[str, Any],
    state: Path,
    stack: list[Any],
    *,
    start_engine: Any = None,
    gateway: bool = False,
) -> None:
    """Local engines for the pool's engine pods (following them), the router in front, one request;
    with ``gateway``, the router also runs the rendered picker flags and the request goes through Envoy.

    Each thing joins ``stack`` as soon as it runs, so the caller stops it even when a later one fails."""
    from kubernetes import client, config

    from lorapool.render import names
    from lorapool_dev.testing.fakekubelet import LocalEngines

    ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
    spec = pool["spec"]
    # The client leaves new_client_from_config unannotated; it returns an ApiClient.
    api = cast(Callable[..., client.ApiClient], config.new_client_from_config)(config_file=str(cluster.kubeconfig))
    stack.append(api)
    token = cluster.service_account_kubeconfig(ns, names.engine_service_account(name), path=state / "engine.kubeconfig")
    engines_box: list[LocalEngines] = []  # filled below: the router asks it which Pod each engine is
    door = _gateway_door(cluster, pool) if gateway else None
    router = _playground_router(cluster, pool, state, engines_box, door[1].argv if door else ())
    stack.append(router)
    replicas = int(spec.get("replicas", 1))
    kind = "vLLM (CPU) engine" if start_engine else "lorapool sim"
    _say(f"Starting a {kind} and a reporting sidecar for each of the {replicas} engine pod(s)")
    engines = LocalEngines(
        api, ns, name, state / "engines", sim_flags=_live_sim_flags(api, pool), report_kubeconfig=token,
        on_change=router.follow, start_engine=start_engine,
    )  # fmt: skip
    stack.append(engines)
    engines_box.append(engines)
    engines.start()  # one engine per engine pod that exists now; pods created later get theirs within a second
    adapters = [a["name"] for a in pool["status"].get("adapters", []) if a["phase"] not in ("Failed", "Conflict")]
    if adapters:
        _ask(router.port, adapters[0])
    envoy = _start_gateway(door, router, stack) if door else None
    if envoy is not None and adapters:
        _ask(int(envoy.url.rsplit(":", 1)[1]), adapters[0], through="Envoy and the endpoint picker")
    _try_it(cluster, pool, state, router.url)
    if start_engine is not None:  # the adapter to try must fit the tiny model the engines serve
        from lorapool_dev.engine.tinymodel import write_tiny_adapter

        write_tiny_adapter(state / "adapters-src" / "my-adapter", rank=8, base_model=spec["baseModel"]["name"])
    # Last: a script waiting for these files finds a playground that serves.
    if envoy is not None:
        (state / "gateway-url").write_text(f"{envoy.url}/v1\n")
    (state / "router-url").write_text(f"{router.url}/v1\n")


def _gateway_door(cluster: Any, pool: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The rendered InferencePool and the router Deployment's picker flags (``lorapool_dev.dev.gateway``)."""
    from lorapool_dev.dev.gateway import read_door
    from lorapool_dev.testing.processes import free_port

    inference_pool, picker = read_door(cluster, pool, free_port)
    for flag in picker.dropped:
        _say(f"Not on this machine: {flag} (a mounted Secret); the picker signs its own certificate")
    _say(f"The router serves the endpoint picker with the rendered flags: {' '.join(picker.argv)}")
    return inference_pool, picker


def _start_gateway(door: tuple[dict[str, Any], Any], router: _Router, stack: list[Any]) -> Any:
    """Envoy in front of the picker, as a GIE gateway configures itself for the InferencePool."""
    from lorapool_dev.dev.gateway import start_gateway
    from lorapool_dev.testing.processes import free_port

    inference_pool, picker = door
    engines = [url.split("://", 1)[1] for url in router.backends]  # FailOpen's fallback: every engine
    envoy = start_gateway(inference_pool, picker, engines, free_port)
    stack.append(envoy)
    _say(
        f"Envoy on {envoy.url}/v1: ext_proc (TLS) to the picker on 127.0.0.1:{picker.port}, ORIGINAL_DST to the engine it picks"
    )
    return envoy


def _live_sim_flags(api: Any, pool: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The engine flags of the pool's plan as it is when an engine starts, not as it was when the playground did.

    Apart from ``_data_plane`` because it is its own read: each engine started later (a roll for new
    vLLM flags, a scale) asks again; when the read fails the plan the playground started with serves."""
    from kubernetes import client

    from lorapool.api.models import GROUP, VERSION

    ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
    spec, plan = pool["spec"], pool["status"]["plan"]

    def sim_flags() -> dict[str, Any]:
        """The pool's plan now: pods that rolled for new vLLM flags get engines with those flags."""
        current = plan
        try:
            live = cast(
                dict[str, Any],
                client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, "lorapools", name),
            )
            current = (live.get("status") or {}).get("plan") or plan
        except client.ApiException:
            pass
        return {
            "served_model_name": spec["baseModel"]["name"], "max_loras": current["maxLoras"],
            "max_lora_rank": current["maxLoraRank"], "max_cpu_loras": current["maxCpuLoras"],
        }  # fmt: skip

    return sim_flags


def _playground_router(
    cluster: Any, pool: dict[str, Any], state: Path, engines_box: list[Any], picker: Sequence[str] = ()
) -> _Router:
    """The router as the pool's chart runs it: its policy and plan flags, reading reports as its ServiceAccount.

    Apart from ``_data_plane`` because it is configuration, not start order: the router starts only
    when ``follow`` hands it engines, and ``engines_box`` names each engine's Pod once it exists."""
    from lorapool.render import names

    ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
    spec, plan = pool["spec"], pool["status"]["plan"]
    router_token = cluster.service_account_kubeconfig(ns, names.router(name), path=state / "router.kubeconfig")
    return _Router(
        policy=spec.get("router", {}).get("policy", "affinity"),
        extra=[
            "--max-loras",
            str(plan["maxLoras"]),
            "--max-cpu-loras",
            str(plan["maxCpuLoras"]),
            "--poll-interval",
            "0.5",
            "--report-pods",
            f"{ns}/{names.selector_string(name, 'engine')}",
            *picker,  # the rendered Deployment's --ext-proc-* flags (lorapool dev --gateway)
        ],
        pods=lambda: {r.sim.url: r.pod for e in engines_box for r in list(e.replicas.values())},
        env={"KUBECONFIG": str(router_token)},
    )


class _Router:
    """The playground's router, on one port for its whole life: restarted in front of the new engines
    whenever engine pods come or go (a roll for new vLLM flags, a scale), since it routes to a static list.
    It routes by the sidecars' reports as in a cluster: ``pods()`` names each engine's Pod, and it reads
    them with the router ServiceAccount's token (``env``: KUBECONFIG)."""

    def __init__(
        self, *, policy: str, extra: list[str], pods: Callable[[], dict[str, str]], env: dict[str, str]
    ) -> None:
        from lorapool_dev.testing.processes import free_port

        self.policy, self.extra, self.pods, self.env = policy, extra, pods, env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backends: list[str] = []
        self._component: Any = None
        self._lock = threading.Lock()

    def follow(self, backends: list[str]) -> None:
        from lorapool_dev.testing.components import start_router

        with self._lock:
            if backends == self.backends and self._component is not None:
                return
            if self._component is not None:
                self._component.close()
                self._component = None
            self.backends = list(backends)
            if backends:
                pods = self.pods()
                named = [a for url in backends if url in pods for a in ("--backend-pod", f"{url}={pods[url]}")]
                self._component = start_router(
                    backends, policy=self.policy, extra=[*self.extra, *named], health_path="/health", timeout_s=30,
                    port=self.port, env=self.env,
                )  # fmt: skip
                _say(f"Router on {self.url}/v1 in front of {len(backends)} engine(s)")

    def stop(self) -> None:
        with self._lock:
            if self._component is not None:
                self._component.close()
                self._component = None


def _try_it(cluster: Any, pool: dict[str, Any], state: Path, router_url: str) -> None:
    """Write a LoRAAdapter the user can apply and print the commands that show it served."""
    from lorapool_dev.cluster.versions import binary
    from lorapool_dev.testing.peft import base_module_shapes, write_peft_adapter

    ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
    base = pool["spec"]["baseModel"]["name"]
    source = write_peft_adapter(
        state / "adapters-src" / "my-adapter", rank=8, base_model=base, module_shapes=base_module_shapes(base)
    )
    adapter = {
        "apiVersion": "lorapool.io/v1alpha1", "kind": "LoRAAdapter",
        "metadata": {"name": "my-adapter", "namespace": ns},
        "spec": {"poolRef": {"name": name}, "source": f"file://{source}"},
    }  # fmt: skip
    (state / "adapter.yaml").write_text(json.dumps(adapter, indent=2) + "\n")
    kubectl = f"{binary('kubectl')} --kubeconfig {cluster.kubeconfig}"
    request = '{"model": "my-adapter", "prompt": "Hello", "max_tokens": 8}'
    print(
        f"""
Try it:
  {kubectl} apply -f {state / "adapter.yaml"}
  {kubectl} wait --for=condition=Ready loraadapter/my-adapter -n {ns}
  curl -s {router_url}/v1/completions -H 'Content-Type: application/json' -d '{request}'
  {kubectl} get loraadapters -n {ns}        # LOADED: replicas whose sidecar reports it loaded
  {kubectl} delete -f {state / "adapter.yaml"}   # the same request then gets 404""",
        flush=True,
    )


def _ask(router_port: int, adapter: str, through: str = "the router") -> None:
    from lorapool_dev.testing.wait import wait_until

    body = json.dumps({"model": adapter, "prompt": "Write a SQL query that counts users.", "max_tokens": 16}).encode()

    def answer() -> tuple[dict[str, Any], str] | None:  # the sidecars load and the router polls asynchronously
        request = urllib.request.Request(f"http://127.0.0.1:{router_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return dict(json.loads(response.read())), response.headers.get("server", "?")
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 503):
                return None
            raise

    got, server = wait_until(f"an answer from {adapter} through {through}", answer, 90, interval_s=0.2)
    print(f"\nThrough {through} (server: {server}):")
    print(f'\n$ curl http://127.0.0.1:{router_port}/v1/completions -d \'{{"model": "{adapter}", ...}}\'')
    print(json.dumps({"model": got["model"], "text": got["choices"][0]["text"], "usage": got["usage"]}, indent=2))
