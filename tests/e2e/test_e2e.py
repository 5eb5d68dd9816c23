"""End to end: install the chart, apply a LoRAPool, wait until it is Ready, look at what it made;
on a real cluster also send an OpenAI request for an adapter through the pool's router.

Runs against the local control plane in CI (`make test`) and against any cluster with
LORAPOOL_E2E_KUBECONFIG (e2e/kind.sh does that on a kind cluster). See conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from lorapool.api.models import DEFAULT_LORAPOOL_IMAGE
from lorapool.api.vllm_versions import CPU_TIER
from lorapool_dev.testing.adapter_server import manifests as adapter_server_manifests
from lorapool_dev.testing.adapter_server import sources as adapter_sources
from lorapool_dev.testing.peft import base_module_shapes, write_peft_adapter
from lorapool_dev.testing.processes import free_port, start_process
from lorapool_dev.testing.scrape import metric_value, scrape
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.delivery.helm import CHART, helm
from tests.e2e import policy_probes
from tests.e2e.conftest import Target, built_image, keep

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RELEASE = SYSTEM_NS = "lorapool-e2e"
OPERATOR = f"{RELEASE}-operator"  # the release name contains the chart's: no "-lorapool" infix
POOL_NS, POOL = "lorapool-e2e-pools", "e2e"
BASE = "meta-llama/Meta-Llama-3-8B-Instruct"
SHAPES = base_module_shapes(BASE)  # the base's shapes: the sidecars verify every adapter against them
ADAPTERS = {"sql-coder": 16, "support-bot": 8}
# Locally the chart's image is the one the operator tests pass to their operator: a session runs
# both, and an operator watching every namespace then renders this pool's children identically.
LOCAL_IMAGE = "lorapool:test"
LOCAL_IDENTITY = "e2e-chart-operator"
# Fully qualified, so a cluster with another `lorapool` resource or category cannot make it ambiguous.
POOLS = "lorapools.lorapool.io"


def image(target: Target | None = None) -> str:
    if target is not None and target.node is not None:
        return built_image("runtime")  # imported into the node's containerd; no registry is reachable
    return os.environ.get("LORAPOOL_E2E_IMAGE") or DEFAULT_LORAPOOL_IMAGE


def sim_image(target: Target) -> str:
    if target.node is not None:
        return built_image("sim")
    return os.environ.get("LORAPOOL_E2E_SIM_IMAGE") or "lorapool-sim:e2e"


def get(target: Target, kind: str, name: str, namespace: str = POOL_NS) -> dict[str, Any] | None:
    result = target.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


@pytest.fixture(scope="module")
def release(e2e_target: Target) -> Iterator[str]:
    """The chart installed with --wait, watching only the pool namespace (namespaced Roles)."""
    chart_image = LOCAL_IMAGE if e2e_target.local else image(e2e_target)
    repository, _, tag = chart_image.rpartition(":")
    e2e_target.kubectl("create", "namespace", POOL_NS, check=False)
    helm(
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "300s",
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set-json",
        f'watchNamespaces=["{POOL_NS}"]',
        "--set",
        "logLevel=DEBUG",
        kubeconfig=e2e_target.kubeconfig,
    )
    yield chart_image
    if keep():
        return
    e2e_target.kubectl("delete", POOLS, POOL, "-n", POOL_NS, "--ignore-not-found", "--wait=true", check=False)
    helm("uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", kubeconfig=e2e_target.kubeconfig, check=False)
    e2e_target.kubectl("delete", "namespace", POOL_NS, SYSTEM_NS, "--wait=false", check=False)


@pytest.fixture(scope="module")
def chart_operator(
    e2e_target: Target, release: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess | None]:
    """Locally: the chart's operator run as a process with the Deployment's own args and a
    TokenRequest token of the chart's ServiceAccount. On a real cluster: the chart's pods."""
    if e2e_target.local is None:
        yield None
        return
    deployment = get(e2e_target, "deployment", OPERATOR, SYSTEM_NS)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = e2e_target.local.service_account_kubeconfig(SYSTEM_NS, sa)
    metrics, liveness = free_port(), free_port()
    env = {"POD_NAME": LOCAL_IDENTITY, "POD_NAMESPACE": SYSTEM_NS}
    args = []
    for arg in container["args"]:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)  # what the kubelet does with $(VAR) in args
        flag = arg.split("=", 1)[0]
        arg = {
            "--metrics-port": f"--metrics-port={metrics}",
            "--liveness-port": f"--liveness-port={liveness}",
            "--bind": "--bind=127.0.0.1",
        }.get(flag, arg)
        args.append(arg)
    assert args[0] == "operator"
    proc = start_process(
        [sys.executable, "-m", "lorapool.cli", *args, "--kubeconfig", str(kubeconfig)],
        f"http://127.0.0.1:{liveness}/healthz",
        90,
        env=env,
    )
    try:
        yield OperatorProcess(proc.popen, metrics, liveness, proc.log_path)
    finally:
        proc.stop()
        print(f"--- chart operator log ---\n{proc.output()[-4000:]}")
        proc.close()


def adapter_server(target: Target, chart_image: str) -> dict[str, str]:
    """An in-cluster HTTP server of small real PEFT adapters (the lorapool image writes them):
    what the operator and the sidecars download from on a cluster without internet access."""
    target.kubectl(
        "apply",
        "-f",
        "-",
        input_text=yaml.safe_dump_all(adapter_server_manifests(POOL_NS, chart_image, ADAPTERS, BASE)),
    )
    target.kubectl("rollout", "status", "deployment/adapters", "-n", POOL_NS, "--timeout=180s", timeout_s=200)
    address = target.kubectl("get", "service", "adapters", "-n", POOL_NS, "-o", "jsonpath={.spec.clusterIP}").stdout
    return adapter_sources(address, ADAPTERS)


def pool_doc(sources: dict[str, str], engine_image: str) -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": POOL, "namespace": POOL_NS},
        "spec": {
            "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
            "gpu": {"product": "A100-80GB", "count": 1},
            "replicas": 2,
            "adapters": [{"name": n, "source": sources[n], "rank": r} for n, r in ADAPTERS.items()],
            "lora": {"maxLoras": "auto", "maxLoraRank": "auto", "maxCpuLoras": "auto"},
            # The simulator image answers as `vllm serve` (Dockerfile target `sim`); it needs no GPU
            # memory, so small requests let it fit on a kind node.
            "vllm": {
                "image": engine_image,
                "maxModelLen": 8192,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            },
        },
    }


@pytest.fixture(scope="module")
def pool(
    e2e_target: Target, release: str, chart_operator: OperatorProcess | None, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The pool applied and Ready, as `kubectl wait` sees it."""
    if e2e_target.real:
        sources = adapter_server(e2e_target, release)
    else:
        root = tmp_path_factory.mktemp("adapters")
        sources = {
            n: "file://" + str(write_peft_adapter(root / n, rank=r, base_model=BASE, module_shapes=SHAPES))
            for n, r in ADAPTERS.items()
        }
    e2e_target.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(pool_doc(sources, sim_image(e2e_target))))
    timeout = "600s" if e2e_target.real else "120s"
    e2e_target.kubectl(
        "wait", "--for=condition=Ready", f"lp/{POOL}", "-n", POOL_NS, f"--timeout={timeout}", timeout_s=660
    )
    return json.loads(e2e_target.kubectl("get", POOLS, POOL, "-n", POOL_NS, "-o", "json").stdout)


def test_chart_operator_runs_and_leads(
    e2e_target: Target, release: str, chart_operator: OperatorProcess | None
) -> None:
    e2e_target.kubectl("wait", "--for=condition=Available", f"deployment/{OPERATOR}", "-n", SYSTEM_NS, "--timeout=120s")
    lease = wait_until(
        "leader Lease held",
        lambda: (held := get(e2e_target, "lease", OPERATOR, SYSTEM_NS)) and held["spec"].get("holderIdentity") and held,
        60,
    )
    holder = lease["spec"]["holderIdentity"]
    if chart_operator is not None:
        assert holder == LOCAL_IDENTITY
    else:
        pods = json.loads(
            e2e_target.kubectl(
                "get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=operator", "-o", "json"
            ).stdout
        )
        assert holder in {p["metadata"]["name"] for p in pods["items"]}


def test_pool_is_ready_with_plan_status_and_a_current_generation(pool: dict[str, Any]) -> None:
    status = pool["status"]
    assert status["observedGeneration"] == pool["metadata"]["generation"]
    for type_ in ("Ready", "Progressing", "Degraded"):
        assert condition(pool, type_)["observedGeneration"] == pool["metadata"]["generation"], type_
    assert condition(pool, "Progressing")["status"] == "False" and condition(pool, "Degraded")["status"] == "False"
    assert status["plan"]["maxLoraRank"] == 16 and status["plan"]["maxLoras"] >= len(ADAPTERS)
    assert {a["name"]: a["rank"] for a in status["adapters"]} == ADAPTERS
    assert status["readyReplicas"] == 2 and status["endpoint"] == f"http://{POOL}.{POOL_NS}.svc:8000/v1"


def test_the_status_names_the_release_every_engine_runs(e2e_target: Target, pool: dict[str, Any]) -> None:
    """The sidecars read GET /version and the operator counts the Ready engines by it (the sim image
    answers the CPU tier's release); kubectl get shows it in the vLLM column."""

    def versions() -> list[dict[str, Any]] | None:
        got = json.loads(e2e_target.kubectl("get", POOLS, POOL, "-n", POOL_NS, "-o", "json").stdout)
        rows = got.get("status", {}).get("engineVersions") or []
        return rows if sum(r["replicas"] for r in rows) == 2 else None

    rows = wait_until("both engines' releases in the status", versions, 60)
    assert [(r["version"].split("+")[0], r["replicas"], r["supported"]) for r in rows] == [(CPU_TIER, 2, True)]
    table = e2e_target.kubectl("get", POOLS, POOL, "-n", POOL_NS).stdout
    assert "VLLM" in table.splitlines()[0] and CPU_TIER in table


def test_children_are_owned_and_use_the_charts_image(e2e_target: Target, release: str, pool: dict[str, Any]) -> None:
    for kind, name in [
        ("deployment", f"{POOL}-engine"),
        ("deployment", f"{POOL}-router"),
        ("service", POOL),
        ("service", f"{POOL}-engine"),
        ("configmap", f"{POOL}-adapters"),
        ("pdb", f"{POOL}-engine"),
        ("role", f"{POOL}-router"),
        ("rolebinding", f"{POOL}-router"),
        ("serviceaccount", f"{POOL}-router"),
    ]:
        child = get(e2e_target, kind, name)
        assert child is not None, f"{kind}/{name} missing"
        assert [o["uid"] for o in child["metadata"]["ownerReferences"]] == [pool["metadata"]["uid"]]
    engine = get(e2e_target, "deployment", f"{POOL}-engine")
    router = get(e2e_target, "deployment", f"{POOL}-router")
    assert engine and router
    containers = {c["name"]: c["image"] for c in engine["spec"]["template"]["spec"]["containers"]}
    assert containers["adapter-sync"] == release  # the chart's --image
    assert router["spec"]["template"]["spec"]["containers"][0]["image"] == release
    printed = e2e_target.kubectl("get", "lp", POOL, "-n", POOL_NS).stdout
    assert POOL in printed and "True" in printed


def test_chart_operator_reconciled_without_errors(
    e2e_target: Target, chart_operator: OperatorProcess | None, pool: dict[str, Any]
) -> None:
    """The chart's RBAC lets its operator do the whole reconcile: no failed reconcile, no 403.
    On a real cluster: the leader pod's metrics through port-forward, its log through the kubelet."""
    if chart_operator is not None:
        assert chart_operator.metric("lorapool_operator_reconciles_total", result="ok") >= 1
        assert chart_operator.metric("lorapool_operator_reconciles_total", result="error") == 0
        assert "Forbidden" not in chart_operator.log.read_text()
        return
    leader = (get(e2e_target, "lease", OPERATOR, SYSTEM_NS) or {})["spec"]["holderIdentity"]
    deployment = get(e2e_target, "deployment", OPERATOR, SYSTEM_NS)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    with _port_forward(e2e_target, f"pod/{leader}", port, SYSTEM_NS) as base:
        page = wait_until("the operator's metrics through port-forward", lambda: _scrape(base), 30)
    assert metric_value(page, "lorapool_operator_reconciles_total", result="ok") >= 1
    assert metric_value(page, "lorapool_operator_reconciles_total", result="error") == 0
    assert "Forbidden" not in e2e_target.kubectl("logs", "-n", SYSTEM_NS, f"pod/{leader}").stdout


def _scrape(base: str) -> str | None:
    try:
        return scrape(base)
    except OSError:
        return None


def test_only_the_charts_operator_reconciles_the_pool(
    e2e_target: Target, chart_operator: OperatorProcess | None, pool: dict[str, Any]
) -> None:
    """One operator per pool: every Event on it was posted by the chart's operator (each Event names
    the replica that posted it). A second operator watching the namespace fought over the pool's
    status and children, so Ready and Progressing flapped between their writes (issue 20: another
    package's cluster-wide test operator outlived its tests)."""

    def events() -> list[dict[str, Any]]:
        selector = f"involvedObject.kind=LoRAPool,involvedObject.name={POOL}"
        out = e2e_target.kubectl("get", "events", "-n", POOL_NS, "--field-selector", selector, "-o", "json").stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    # PoolReady is posted right after the Ready status the fixture waited for: wait for it, then read all.
    seen = wait_until(
        "the PoolReady Event", lambda: (e := events()) and any(x["reason"] == "PoolReady" for x in e) and e, 60
    )
    if chart_operator is not None:
        operators = {LOCAL_IDENTITY}
    else:
        pods = e2e_target.kubectl(
            "get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=operator", "-o", "json"
        ).stdout
        operators = {p["metadata"]["name"] for p in json.loads(pods)["items"]}
    posted_by = {e.get("reportingInstance") for e in seen}
    assert posted_by <= operators, f"Events on the pool posted by {sorted(map(str, posted_by - operators))} too"


@contextlib.contextmanager
def _port_forward(target: Target, resource: str, remote: int, namespace: str = POOL_NS) -> Iterator[str]:
    """`kubectl port-forward` to a free local port; yields http://127.0.0.1:<port>."""
    port = free_port()
    cmd = [target.kubectl_bin, f"--kubeconfig={target.kubeconfig}", "port-forward", "-n", namespace]
    forward = subprocess.Popen(
        [*cmd, resource, f"{port}:{remote}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_router_answers_an_openai_request_for_an_adapter(e2e_target: Target, pool: dict[str, Any]) -> None:
    if not e2e_target.real:
        pytest.skip("KWOK runs no containers: the router and engines are fakes on the local control plane")
    import openai

    with _port_forward(e2e_target, f"svc/{POOL}", 8000) as base:

        def listed() -> bool:
            try:
                models = json.loads(urllib.request.urlopen(f"{base}/v1/models", timeout=5).read())
            except OSError:
                return False
            return set(ADAPTERS) <= {m["id"] for m in models["data"]}

        wait_until("router lists the adapters", listed, 300)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=3, timeout=60)
        completion = client.completions.create(model="sql-coder", prompt="SELECT", max_tokens=8)
        assert completion.model == "sql-coder" and completion.choices[0].text
        chat = client.chat.completions.create(
            model="support-bot", messages=[{"role": "user", "content": "hi"}], max_tokens=8
        )
        assert chat.choices[0].message.content


# -- NetworkPolicy: the suite's real node enforces it (kube-network-policies), as kind's kindnet does --

GATEWAY_NS = "lorapool-e2e-gateway"
GATEWAY_LABELS = {"app.kubernetes.io/name": "e2e-gateway-data-plane"}


def _router_labels() -> dict[str, str]:
    from lorapool.render import names

    return names.selector(POOL, "router")


OUTSIDER = policy_probes.ProbePod(POOL_NS, "probe-outsider", {"app": "someone-else"})
ROUTER_LOOKALIKE = policy_probes.ProbePod(POOL_NS, "probe-router", _router_labels())
FOREIGN_ROUTER = policy_probes.ProbePod(GATEWAY_NS, "probe-foreign-router", _router_labels())  # another namespace
GATEWAY = policy_probes.ProbePod(GATEWAY_NS, "probe-gateway", GATEWAY_LABELS)
PROBES = (OUTSIDER, ROUTER_LOOKALIKE, FOREIGN_ROUTER, GATEWAY)


@pytest.fixture(scope="module")
def probes(e2e_target: Target, pool: dict[str, Any]) -> Iterator[None]:
    """Idle pods with chosen labels, started together once (never Ready: none joins a Service)."""
    if not e2e_target.real:
        pytest.skip("no CNI on the local control plane: tests/render/test_security.py judges the policy by labels")
    policy_probes.start(e2e_target.kubectl, PROBES, image(e2e_target))
    yield
    if not keep():
        policy_probes.delete(e2e_target.kubectl, PROBES)
        e2e_target.kubectl("delete", "namespace", GATEWAY_NS, "--wait=false", check=False)


def _ips(target: Target, component: str) -> list[str]:
    from lorapool.render import names

    prefix = f"{names.engine(POOL) if component == 'engine' else names.router(POOL)}-"
    return policy_probes.pod_ips(target.kubectl, POOL_NS, names.selector_string(POOL, component), prefix)


def test_only_the_router_reaches_the_engines_lora_api(e2e_target: Target, pool: dict[str, Any], probes: None) -> None:
    """The pool's NetworkPolicy: another pod of the namespace, and a pod wearing the router's labels
    in another namespace, are refused at an engine's port 8000; a pod wearing them in the pool's
    namespace is let through (so the refusals are the policy's), and the router still serves."""
    (ip, *_) = _ips(e2e_target, "engine")
    assert policy_probes.load_lora(e2e_target.kubectl, OUTSIDER, ip).startswith("TIMEOUT")
    assert policy_probes.load_lora(e2e_target.kubectl, FOREIGN_ROUTER, ip).startswith("TIMEOUT")
    assert policy_probes.load_lora(e2e_target.kubectl, ROUTER_LOOKALIKE, ip).startswith("REACHED")
    test_router_answers_an_openai_request_for_an_adapter(e2e_target, pool)  # and the router still serves


def test_the_sidecars_load_and_report_under_the_policy(e2e_target: Target, pool: dict[str, Any], probes: None) -> None:
    """The sidecar calls its own engine over localhost, which no NetworkPolicy filters, and reports
    through the API server: under enforcement (on since before the chart) every adapter is loaded
    on both replicas and the kubelet's probes pass. Its status port stays closed to other pods
    (only metricsNamespace is admitted there), the router's lookalike included."""
    from lorapool.render import names
    from lorapool_dev.cluster import netpol

    if e2e_target.node is not None:
        assert netpol.enforcing(e2e_target.node.netns)

    def loaded() -> dict[str, int] | None:
        got = json.loads(e2e_target.kubectl("get", POOLS, POOL, "-n", POOL_NS, "-o", "json").stdout)
        seen = {a["name"]: a.get("loadedReplicas") for a in got["status"].get("adapters", [])}
        return seen if seen == dict.fromkeys(ADAPTERS, 2) else None

    wait_until("every adapter loaded on both replicas", loaded, 60)
    ips = _ips(e2e_target, "engine")
    assert len(ips) == 2, "both engine pods Ready: the kubelet's probes of engine and sidecar pass"
    for probe in (OUTSIDER, ROUTER_LOOKALIKE):
        assert policy_probes.connect(e2e_target.kubectl, probe, ips[0], names.SIDECAR_STATUS_PORT) == "TIMEOUT"


def test_the_pickers_grpc_port_admits_only_the_gateways_data_plane(
    e2e_target: Target, pool: dict[str, Any], probes: None
) -> None:
    """With the gateway door (`both`: the HTTP door stays), spec.router.gateway's namespace and pod
    labels reach the picker's gRPC port and the engines; the router's lookalike, another pod of the
    gateway's namespace and one of the pool's are refused at the picker. Last: it rolls the routers."""
    from lorapool.render import names

    gateway = {"frontDoor": "both", "gateway": {"namespace": GATEWAY_NS, "podLabels": GATEWAY_LABELS}}
    patch = json.dumps({"spec": {"router": gateway}})
    e2e_target.kubectl("patch", POOLS, POOL, "-n", POOL_NS, "--type=merge", "-p", patch)
    try:
        policy = names.router_network_policy(POOL)
        wait_until("the router NetworkPolicy", lambda: get(e2e_target, "networkpolicy", policy), 60)
        deployment = f"deployment/{names.router(POOL)}"
        e2e_target.kubectl("rollout", "status", deployment, "-n", POOL_NS, "--timeout=120s", timeout_s=130)
        seen: list[tuple[str, str]] = []  # (router pod IP, what the gateway's pod got there)

        def admitted() -> str | None:
            (ip, *_) = _ips(e2e_target, "router") or ["(no Ready router pod)"]
            seen.append((ip, policy_probes.connect(e2e_target.kubectl, GATEWAY, ip, names.EXT_PROC_PORT)))
            return ip if seen[-1][1] == "REACHED" else None

        def describe() -> str:
            pods = e2e_target.kubectl("get", "pods", "-n", POOL_NS, "-o", "wide", check=False).stdout
            return f"probes from {GATEWAY.name}: {seen[-3:]}\n{pods}\n{get(e2e_target, 'networkpolicy', policy)}"

        ip = wait_until("the gateway's pod reaches the picker", admitted, 60, describe=describe)
        for probe in (ROUTER_LOOKALIKE, FOREIGN_ROUTER, OUTSIDER):
            assert policy_probes.connect(e2e_target.kubectl, probe, ip, names.EXT_PROC_PORT) == "TIMEOUT", probe
        (engine_ip, *_) = _ips(e2e_target, "engine")
        assert policy_probes.connect(e2e_target.kubectl, GATEWAY, engine_ip, names.ENGINE_PORT) == "REACHED"
    finally:
        back = json.dumps({"spec": {"router": {"frontDoor": "router", "gateway": None}}})
        e2e_target.kubectl("patch", POOLS, POOL, "-n", POOL_NS, "--type=merge", "-p", back, check=False)
