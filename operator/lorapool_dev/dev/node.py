"""`lorapool dev --node real`: the playground with every component a real pod on a real kubelet.

Called by `lorapool_dev.dev.playground`. Builds the images (`lorapool image build`, cached), starts a control
plane with one real node (`lorapool_dev.cluster.node`: everything in a network namespace of its own,
the KWOK nodes tainted), installs the chart with the built image (the operator runs as its pod),
serves the pool's adapters from an in-cluster HTTP server, applies the pool with the `sim` image
as its engine, waits until it is Ready, prints every pod with its node and container readiness,
and sends an OpenAI request for the first adapter through the router Service (kubectl
port-forward, from the root namespace). `<dir>/kubeconfig` and `<dir>/router-url` work from here.

The pool is made to fit this machine: its engines run the simulator with small requests (the
real node has this machine's CPUs and memory, not an A100's host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from lorapool_dev.cluster.node import RealNode
from lorapool_dev.cluster.node_config import NODE_NAME
from lorapool_dev.cluster.versions import binary
from lorapool_dev.image.build import build_images
from lorapool_dev.testing import adapter_server
from lorapool_dev.testing.http import request
from lorapool_dev.testing.wait import WaitTimeout, wait_until

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "lorapool"
SYSTEM_NS = "lorapool-system"
# What each engine pod asks of the real node (it runs the simulator, not vLLM on a GPU).
SMALL_ENGINE = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
TRY_ADAPTER = "my-adapter"  # served in the cluster, not in the pool: the "Try it" block adds it


def run_real(args: argparse.Namespace, pool_doc: dict[str, Any], say: Callable[[str], None]) -> int:
    """The whole playground on the real node; stops everything on the way out."""
    state = args.dir.expanduser()
    say("Building the images if needed (lorapool image build; cached by content)")
    images = {image.target: image for image in build_images()}
    say("Starting the control plane and a real kubelet node in a network namespace of this run's own")
    try:
        with RealNode(
            state / "node", [Path(i.archive) for i in images.values()], timeout_s=args.timeout_seconds
        ) as node:
            shutil.copyfile(node.kubeconfig, state / "kubeconfig")
            return _play(node, args, pool_doc, {t: i.reference for t, i in images.items()}, say)
    finally:  # both stop working with the node: leave no stale copy
        (state / "kubeconfig").unlink(missing_ok=True)
        (state / "router-url").unlink(missing_ok=True)


def _play(
    node: RealNode,
    args: argparse.Namespace,
    pool_doc: dict[str, Any],
    images: dict[str, str],
    say: Callable[[str], None],
) -> int:
    """Chart, adapters, pool, Ready, the pods, one answer: 0 when every pod is Ready on the real node."""
    state = args.dir.expanduser()
    ns, name = pool_doc["metadata"]["namespace"], pool_doc["metadata"]["name"]
    _install_chart(node, images["runtime"], ns, say)
    spare = _apply_pool(node, pool_doc, images["runtime"], images["sim"], say)
    _wait_ready(node, ns, name, args.timeout_seconds, say)
    pods = _print_pods(node, (SYSTEM_NS, ns))
    with node.port_forward(f"svc/{name}", 8000, ns) as router_url:
        (state / "router-url").write_text(router_url + "\n")
        _ask(router_url, pool_doc["spec"]["adapters"][0]["name"], args.timeout_seconds, say)
        off_node = [p for p in pods if p["node"] != NODE_NAME or not p["ready"]]
        if off_node:
            say(f"Not every pod is Ready on {NODE_NAME}: {off_node}")
            return 1
        _try_it(state, pool_doc, spare, router_url)
        if not args.once:
            say(f"Playground running on the real node. KUBECONFIG={state / 'kubeconfig'}  Ctrl-C stops it.")
            while True:
                time.sleep(3600)
    return 0


def deploy(
    node: RealNode,
    pool_doc: dict[str, Any],
    images: dict[str, str],
    timeout_s: float,
    before_pool: Sequence[dict[str, Any]] = (),
) -> None:
    """The chart and the pool on a node someone else started, until the pool is Ready: what the
    playground does before its first answer (the fault harness, tests/node/test_faults_real.py).
    ``before_pool``: objects applied in the pool's namespace before it (e.g. a Secret its pods read)."""
    ns, name = pool_doc["metadata"]["namespace"], pool_doc["metadata"]["name"]
    _install_chart(node, images["runtime"], ns, print)
    for obj in before_pool:
        node.kubectl("apply", "-f", "-", input_text=json.dumps(obj))
    _apply_pool(node, pool_doc, images["runtime"], images["sim"], print)
    _wait_ready(node, ns, name, timeout_s, print)


def undeploy(node: RealNode, ns: str) -> None:
    """Remove what `deploy` made (the release, both namespaces) so another test can use the node.
    Without waiting: the pods' graceful stops (about 40 s) go on while the next test runs."""
    _helm(node, "uninstall", "lorapool", "-n", SYSTEM_NS, "--ignore-not-found")
    node.kubectl("delete", "namespace", ns, SYSTEM_NS, "--wait=false", "--ignore-not-found", timeout_s=120)


def _helm(node: RealNode, *args: str) -> None:
    helm_home = node.layout.root / "helm"
    env = {f"HELM_{k}_HOME": str(helm_home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
    argv = [str(binary("helm")), *args, f"--kubeconfig={node.kubeconfig}"]
    result = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=420, check=False)
    if result.returncode != 0:
        raise SystemExit(f"lorapool dev: helm {args[0]} failed: {result.stderr.strip()}")


def _install_chart(node: RealNode, image: str, ns: str, say: Callable[[str], None]) -> None:
    say(f"Installing the chart (operator image {image}) watching namespace {ns}")
    node.kubectl("create", "namespace", ns)
    repository, _, tag = image.rpartition(":")
    _helm(
        node,
        "install", "lorapool", str(CHART), "-n", SYSTEM_NS, "--create-namespace", "--wait", "--timeout", "300s",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set-json", f'watchNamespaces=["{ns}"]',
    )  # fmt: skip


def _apply_pool(node: RealNode, pool_doc: dict[str, Any], image: str, sim: str, say: Callable[[str], None]) -> str:
    """Serve the adapters in the cluster and apply the pool; the source URL of one more adapter,
    served but not in the pool, for the user to add (``_try_it``)."""
    spec = pool_doc["spec"]
    ranks = {a["name"]: int(a.get("rank") or 8) for a in spec["adapters"]}
    ns = pool_doc["metadata"]["namespace"]
    say(f"Serving the pool's adapters from an in-cluster HTTP server: {', '.join(ranks)} (and {TRY_ADAPTER})")
    ranks[TRY_ADAPTER] = 8
    docs = adapter_server.manifests(ns, image, ranks, spec["baseModel"]["name"])
    node.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
    node.kubectl("rollout", "status", f"deployment/{adapter_server.NAME}", "-n", ns, "--timeout=180s", timeout_s=200)
    address = node.kubectl("get", "service", adapter_server.NAME, "-n", ns, "-o", "jsonpath={.spec.clusterIP}").stdout
    urls = adapter_server.sources(address, ranks)
    for adapter in spec["adapters"]:
        adapter["source"] = urls[adapter["name"]]
    spec["vllm"] = {**spec.get("vllm", {}), "image": sim, "resources": SMALL_ENGINE}
    say(f"Applying LoRAPool {ns}/{pool_doc['metadata']['name']} with engine image {sim}")
    node.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pool_doc))
    return urls[TRY_ADAPTER]


def _try_it(state: Path, pool_doc: dict[str, Any], source: str, router_url: str) -> None:
    """Write a LoRAAdapter whose source the pods can reach (the in-cluster server) and print the
    commands that show it served, as the fake-node playground does."""
    ns, name = pool_doc["metadata"]["namespace"], pool_doc["metadata"]["name"]
    adapter = {
        "apiVersion": "lorapool.io/v1alpha1", "kind": "LoRAAdapter",
        "metadata": {"name": TRY_ADAPTER, "namespace": ns},
        "spec": {"poolRef": {"name": name}, "source": source},
    }  # fmt: skip
    (state / "adapter.yaml").write_text(json.dumps(adapter, indent=2) + "\n")
    kubectl = f"{binary('kubectl')} --kubeconfig {state / 'kubeconfig'}"
    body = json.dumps({"model": TRY_ADAPTER, "prompt": "Hello", "max_tokens": 8})
    print(
        f"""
Try it:
  {kubectl} apply -f {state / "adapter.yaml"}
  {kubectl} wait --for=condition=Ready loraadapter/{TRY_ADAPTER} -n {ns}
  curl -s {router_url}/v1/completions -H 'Content-Type: application/json' -d '{body}'
  {kubectl} get loraadapters -n {ns}        # LOADED: replicas whose sidecar reports it loaded
  {kubectl} delete -f {state / "adapter.yaml"}   # the same request then gets 404
(the front door is a kubectl port-forward to the router Service, started again if its pod goes)""",
        flush=True,
    )


def _wait_ready(node: RealNode, ns: str, name: str, timeout_s: float, say: Callable[[str], None]) -> None:
    result = node.kubectl("wait", "--for=condition=Ready", f"lorapools.lorapool.io/{name}", "-n", ns,
                          f"--timeout={int(timeout_s)}s", check=False, timeout_s=timeout_s + 30)  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"lorapool dev: {ns}/{name} was not Ready after {timeout_s:.0f}s: {result.stderr.strip()}")
    say(f"LoRAPool {ns}/{name} is Ready")


def _print_pods(node: RealNode, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every pod of the operator's and the pool's namespaces: node, containers ready/total."""
    rows = []
    for ns in namespaces:
        for pod in json.loads(node.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]:
            statuses = pod.get("status", {}).get("containerStatuses", [])
            ready = sum(1 for c in statuses if c.get("ready"))
            rows.append(
                {
                    "namespace": ns,
                    "pod": pod["metadata"]["name"],
                    "node": pod["spec"].get("nodeName", ""),
                    "containers": f"{ready}/{len(pod['spec']['containers'])}",
                    "ready": bool(statuses) and ready == len(pod["spec"]["containers"]),
                }
            )
    print(f"\n{'NAMESPACE':<18} {'POD':<44} {'NODE':<14} READY")
    for row in rows:
        print(f"{row['namespace']:<18} {row['pod']:<44} {row['node']:<14} {row['containers']}")
    print()
    return rows


def _ask(router_url: str, adapter: str, timeout_s: float, say: Callable[[str], None]) -> None:
    """One completion for `adapter` through the router; the sidecars load it asynchronously."""
    body = {"model": adapter, "prompt": "Hello", "max_tokens": 8}

    def answer() -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            reply = request(f"{router_url}/v1/completions", "POST", body, timeout_s=10)
            if reply.status == 200:
                parsed: dict[str, Any] = reply.json()
                return parsed
        return None

    try:
        reply = wait_until(f"an answer for {adapter} through the router", answer, timeout_s, interval_s=1.0)
    except WaitTimeout:
        raise SystemExit(f"lorapool dev: the router at {router_url} did not answer for {adapter}") from None
    say(f"POST {router_url}/v1/completions model={adapter} answered:")
    print(json.dumps(reply, indent=2))
