"""`lorapool dev`: the local playground, on one machine, without Docker.

Starts the local control plane (fake A100 nodes), installs the CRDs and the operator's
RBAC, runs the operator as its own ServiceAccount, applies a pool (default
``examples/lorapool.yaml``), waits until it is Ready and prints what happened: the
objects, the plan and the nodes the engine pods landed on. The fake nodes run no
containers, so the data plane runs beside it as local processes: one `lorapool sim`
per engine replica (the pool's derived flags), an adapter-sync sidecar per sim fed
real PEFT adapters made on the spot, and `lorapool router` in front. It then sends an
OpenAI request for the first adapter through the router and prints the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(os.environ.get("LORAPOOL_CACHE", "~/.cache/lorapool")).expanduser() / "dev"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", type=Path, default=None,
                        help="pool YAML to apply (default: the bundled examples/lorapool.yaml)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})")
    parser.add_argument("--once", action="store_true", help="print the result and stop everything (no Ctrl-C wait)")
    parser.add_argument("--no-data-plane", action="store_true", help="skip the local sim/sidecar/router processes")
    parser.add_argument("--timeout-seconds", type=float, default=180.0, help="how long to wait for Ready")


def _example() -> str:
    repo_example = Path(__file__).resolve().parents[2] / "examples" / "lorapool.yaml"
    if repo_example.exists():
        return repo_example.read_text()
    return resources.files("lorapool").joinpath("examples/lorapool.yaml").read_text()


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    import yaml

    from lorapool.api.load import parse_object
    from lorapool.cluster import build
    from lorapool.cluster.runtime import LocalCluster
    from lorapool.testing.components import operator_argv
    from lorapool.testing.processes import free_port, start_process

    text = args.filename.read_text() if args.filename else _example()
    docs = [d for d in yaml.safe_load_all(text) if d]
    pool_doc = next(d for d in docs if d.get("kind") == "LoRAPool")
    pool = parse_object(pool_doc)
    ns, name = pool.metadata.namespace, pool.metadata.name
    repo = Path(__file__).resolve().parents[2]
    state = args.dir.expanduser()
    state.mkdir(parents=True, exist_ok=True)
    processes: list[Any] = []

    _say("Building the control plane if needed (first run only: ~25 min, cached in ~/.cache/lorapool)")
    build.ensure_built()
    cluster = LocalCluster(state / "cluster", kubeconfig=state / "kubeconfig", timeout_s=180)
    _say("Starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK fake GPU nodes")
    cluster.start()
    try:
        cluster.kubectl("apply", "--server-side", "-f", str(repo / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/lorapools.lorapool.io")
        for namespace in ("lorapool-system", ns):
            cluster.kubectl("create", "namespace", namespace, check=False)
        cluster.kubectl("apply", "-f", str(repo / "deploy" / "rbac.yaml"))
        sa_kubeconfig = cluster.service_account_kubeconfig("lorapool-system", "lorapool-operator")
        _say("Running the operator as ServiceAccount lorapool-system/lorapool-operator")
        metrics, liveness = free_port(), free_port()
        argv = operator_argv(kubeconfig=sa_kubeconfig, metrics_port=metrics, liveness_port=liveness,
                             extra=["--metadata-timeout-seconds", "3"])
        operator = start_process(argv, f"http://127.0.0.1:{liveness}/readyz", timeout=60)
        processes.append(operator)
        _say(f"Applying LoRAPool {ns}/{name}")
        cluster.kubectl("apply", "-f", "-", input_text=text)
        pool_json = _wait_ready(cluster, ns, name, args.timeout_seconds)
        _report(cluster, pool_json, ns, name)
        if not args.no_data_plane:
            _data_plane(pool_json, state, processes)
        if args.once:
            return 0
        print(f"\nPlayground running. KUBECONFIG={cluster.kubeconfig}  Press Ctrl-C to stop.", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
        return 0
    finally:
        for proc in reversed(processes):
            proc.stop()
        cluster.stop()


def _wait_ready(cluster: Any, ns: str, name: str, timeout_s: float) -> dict[str, Any]:
    from lorapool.testing.wait import WaitTimeout, wait_until

    said = {"message": ""}

    def ready() -> dict[str, Any] | None:
        result = cluster.kubectl("get", "lorapool", name, "-n", ns, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        pool = json.loads(result.stdout)
        cond = next((c for c in pool.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
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
    print(cluster.kubectl("get", "deployments,services,configmaps,pdb", "-n", ns, "-l",
                          f"lorapool.io/pool={name}").stdout)
    print("Plan (status.plan):")
    for flag, key in (("--max-loras", "maxLoras"), ("--max-lora-rank", "maxLoraRank"), ("--max-cpu-loras", "maxCpuLoras")):
        print(f"  {flag:<16} {plan[key]:<6} {plan['reasons'][key]}")
    m = plan["memory"]
    print(f"  KV cache: {m['kvCacheBytes'] / 1e9:.1f} GB = {m['kvCacheTokens']:,} tokens; LoRA buffers "
          f"{m['loraBytes'] / 1e9:.1f} GB (naive rank 256: {m['naiveLoraBytes'] / 1e9:.1f} GB)")
    print("\nEngine pods and their nodes:")
    print(cluster.kubectl("get", "pods", "-n", ns, "-l", f"lorapool.io/pool={name}", "-o", "wide",
                          "-L", "app.kubernetes.io/component").stdout)
    print("Adapters:")
    for adapter in status.get("adapters", []):
        print(f"  {adapter['name']:<20} rank {adapter.get('rank')!s:<4} {adapter['phase']:<8} {adapter.get('message', '')}")
    print(f"\nEndpoint in the cluster: {status['endpoint']}")


def _data_plane(pool: dict[str, Any], state: Path, procs: list[Any]) -> None:
    """One sim + sidecar per replica with the pool's flags, and the router in front.

    Each process joins ``procs`` as soon as it runs, so the caller stops it even when a later one fails."""
    from lorapool.api.adapterset import AdapterSet, DesiredAdapter
    from lorapool.testing.components import start_router, start_sidecar, start_sim
    from lorapool.testing.peft import write_peft_adapter

    spec, plan = pool["spec"], pool["status"]["plan"]
    base = spec["baseModel"]["name"]
    ready = [a for a in pool["status"].get("adapters", []) if a["phase"] == "Ready"]
    desired = []
    for adapter in ready:
        # The example's hf:// and s3:// sources are not reachable here; serve local copies of the same rank.
        path = write_peft_adapter(state / "adapters-src" / adapter["name"], rank=adapter.get("rank") or 8, base_model=base)
        desired.append(DesiredAdapter(name=adapter["name"], source=f"file://{path}", rank=adapter.get("rank")))
    config = state / "adapters.json"
    config.write_text(AdapterSet(pool=pool["metadata"]["name"], base_model=base, max_lora_rank=plan["maxLoraRank"],
                                 adapters=tuple(desired)).to_json())
    backends = []
    for replica in range(max(1, min(int(spec.get("replicas", 1)), 2))):
        _say(f"Starting lorapool sim (replica {replica}) with the pool's flags")
        sim = start_sim(
            served_model_name=base, max_loras=plan["maxLoras"], max_lora_rank=plan["maxLoraRank"],
            max_cpu_loras=plan["maxCpuLoras"], seed=replica, timeout_s=30,
        )  # fmt: skip
        procs.append(sim.proc)
        procs.append(start_sidecar(config=config, engine_url=sim.url, adapter_dir=state / f"adapters-{replica}").proc)
        backends.append(sim.url)
    router = start_router(
        backends, policy=spec.get("router", {}).get("policy", "affinity"), health_path="/health", timeout_s=30,
        extra=["--max-loras", str(plan["maxLoras"]), "--max-cpu-loras", str(plan["maxCpuLoras"])],
    )  # fmt: skip
    procs.append(router.proc)
    router_port = router.port
    _say(f"Router on http://127.0.0.1:{router_port}/v1 in front of {len(backends)} sim replica(s)")
    if desired:
        _ask(router_port, desired[0].name, backends)


def _ask(router_port: int, adapter: str, backends: list[str]) -> None:
    from lorapool.testing.wait import wait_until

    def loaded_everywhere() -> bool:  # the sidecars load adapters asynchronously
        return all(adapter in urllib.request.urlopen(f"{b}/v1/models", timeout=5).read().decode() for b in backends)

    wait_until(f"{adapter} loaded on every replica", loaded_everywhere, 60)
    body = json.dumps({"model": adapter, "prompt": "Write a SQL query that counts users.", "max_tokens": 16}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{router_port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    print(f"\n$ curl http://127.0.0.1:{router_port}/v1/completions -d '{{\"model\": \"{adapter}\", ...}}'")
    print(json.dumps({"model": answer["model"], "text": answer["choices"][0]["text"], "usage": answer["usage"]}, indent=2))
