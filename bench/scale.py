"""Catalogue scale (issue 44 item 4): the real operator against the local control plane, at 10,000 adapters.

    python -m bench.scale --adapters 10000 --replicas 16          # one pool, 16 KWOK A100 replicas
    python -m bench.scale --pools 100 --adapters-per-pool 100     # 100 pools x 100 adapters, one namespace
    python -m bench.scale --adapters 300 --replicas 4             # a quick check of the harness (~3 min)
    python -m bench.scale --operator-tree /tmp/scale-base         # measure another checkout's operator
    python -m bench.scale --report                                # the RESULTS.md section of the results files

Runs outside CI, on its own control plane (KWOK A100 nodes; the API server audits the operator's
writes). ``lorapool operator`` runs as its ServiceAccount; N parallel clients apply the pool(s) and
the LoRAAdapters at once (a GitOps bulk apply); each engine pod then gets the report its sidecar
would write (its share all Loaded; no data plane), built with the sidecar's public names only.
Measured: Accepted (from the first create), Ready (from the reports), the operator's peak RSS and
CPU (/proc), its writes by kind and verb (audit log), every object's size, engine ReplicaSets (pod
templates), one more adapter (with many pools: while the others take a new revision), and what a
SIGKILL + restart writes. Verdicts against the issue's targets: ``bench/scale_report.py``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/scale.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import scale_report as sr
from lorapool.api.adapterset import AdapterSet
from lorapool.render.names import adapters_configmap
from lorapool_dev.cluster.manifests import FakeNode
from lorapool_dev.cluster.runtime import LocalCluster
from lorapool_dev.testing.components import operator_argv
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import free_port
from lorapool_dev.testing.wait import WaitTimeout, wait_until

REPO = Path(__file__).resolve().parents[1]
SLOT_ANNOTATION = "lorapool.io/slot"  # the operator's placement slot on an engine pod (docs/placement.md)
INSTANCE, ENGINES = "app.kubernetes.io/instance", "app.kubernetes.io/component=engine"  # the engine pods' labels
# --- the cluster, with the operator's writes audited -------------------------------------------


class AuditedCluster(LocalCluster):
    """A LocalCluster whose API server writes an audit log of the operator's write requests only."""

    def __init__(self, state_dir: Path, nodes: Sequence[FakeNode], audit_log: Path) -> None:
        super().__init__(state_dir, nodes=nodes, timeout_s=180.0)
        self.audit_log = audit_log
        self.policy = audit_log.with_name("audit-policy.json")
        self.policy.write_text(json.dumps(sr.AUDIT_POLICY))

    def _args(self, name: str) -> list[str]:
        args = super()._args(name)
        if name == "kube-apiserver":
            args += [f"--audit-policy-file={self.policy}", f"--audit-log-path={self.audit_log}"]
        return args


def install(cluster: LocalCluster, tree: Path) -> Path:
    """The tree's CRDs and RBAC, the namespace; returns the operator ServiceAccount's kubeconfig."""
    crds = ("crd/lorapools.lorapool.io", "crd/loraadapters.lorapool.io")
    for args in (["apply", "--server-side", "-f", str(tree / "crds")], ["wait", "--for=condition=Established", *crds]):
        result = cluster.kubectl(*args, check=False)
        if result.returncode:  # e.g. a CRD the API server refuses: say which and why
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr[-1500:]}")
    cluster.kubectl("create", "namespace", "lorapool-system")
    cluster.kubectl("create", "namespace", sr.NS)
    cluster.kubectl("apply", "-f", str(tree / "deploy" / "rbac.yaml"))
    return cluster.service_account_kubeconfig("lorapool-system", "lorapool-operator", expiration_s=24 * 3600)


# --- the operator process -----------------------------------------------------------------------


@dataclass
class Operator:
    """``lorapool operator`` from ``tree`` (its own PYTHONPATH), this namespace only, no leader election."""

    tree: Path
    kubeconfig: Path
    log: Path
    args: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0

    def start(self) -> None:
        live, self.metrics_port = free_port(), free_port()
        extra = ["--namespace", sr.NS, "--no-leader-election", "--image", "lorapool:test", *self.args]
        argv = operator_argv(
            kubeconfig=self.kubeconfig, metrics_port=self.metrics_port, liveness_port=live, extra=extra
        )
        path = os.pathsep.join([str(self.tree / "operator"), str(self.tree)])
        env = {**os.environ, "PYTHONPATH": path, "MALLOC_ARENA_MAX": "2"}  # as the chart runs it
        with self.log.open("ab") as out:
            proc = self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_until(
            "the operator ready", lambda: _get(f"http://127.0.0.1:{live}/readyz") or proc.poll() is not None, 120
        )
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited: {self.log.read_text(errors='replace')[-2000:]}")

    def reconciles(self) -> float:
        """The operator's own count of pool reconciles (any result) since it started."""
        return sr.metric_sum(
            _get(f"http://127.0.0.1:{self.metrics_port}/metrics"), "lorapool_operator_reconciles_total"
        )

    def stats(self) -> tuple[float, float]:
        """(peak RSS MB, CPU seconds) of the running process, from /proc."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return sr.peak_rss_mb(status), sr.cpu_seconds(stat, os.sysconf("SC_CLK_TCK"))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL: no graceful shutdown, as a node loss or OOM kill
            self.proc.wait(timeout=30)


def _get(url: str) -> str:
    """The page at ``url``; "" while nothing answers (the process is starting)."""
    try:
        return str(urllib.request.urlopen(url, timeout=5).read().decode())
    except OSError:
        return ""


# --- the API ------------------------------------------------------------------------------------


class ApiError(RuntimeError):
    """The API server refused a request (the message carries its status and reason)."""


class Api:
    """Raw JSON over the kubernetes client's connection (no model decoding: 10,000 objects decode slowly)."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import config

        self.client: Any = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]

    def raw(
        self, method: str, path: str, body: Any = None, query: Sequence[tuple[str, str]] = (), ctype: str = ""
    ) -> Any:
        """The urllib3 response (read ``.data`` or stream it); a 4xx/5xx raises ApiError with the server's message."""
        headers = {"Content-Type": ctype or "application/json", "Accept": "application/json"}
        request = self.client.param_serialize(method, path, query_params=list(query), header_params=headers, body=body,
                                              auth_settings=["BearerToken"])  # fmt: skip
        resp = self.client.call_api(*request[:4], _request_timeout=120)
        if resp.status >= 400:
            raise ApiError(f"{method} {path}: {resp.status} {resp.read()[:300]!r}")
        return resp.response

    def call(
        self, method: str, path: str, body: Any = None, query: Sequence[tuple[str, str]] = (), ctype: str = ""
    ) -> Any:
        data = self.raw(method, path, body, query, ctype).data
        return json.loads(data) if data else None

    def metrics(self) -> Counter[str]:
        """The API server's write counters (every client): context for the operator's own, audited writes."""
        return sr.request_totals(self.raw("GET", "/metrics").data.decode())


def in_parallel(kubeconfig: Path, clients: int, jobs: Sequence[Callable[[Api], None]]) -> list[str]:
    """Run ``jobs`` on ``clients`` threads, each with its own connection; returns the errors."""
    local, errors = threading.local(), []

    def run(job: Callable[[Api], None]) -> None:
        if not hasattr(local, "api"):
            local.api = Api(kubeconfig)
        try:
            job(local.api)
        except Exception as exc:  # a refused create is a result to report, not a crash
            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(run, jobs))
    return errors


# --- watching the adapters' conditions ---------------------------------------------------------


@dataclass
class Watcher:
    """When each LoRAAdapter's Accepted and Ready conditions were first seen True (Unix seconds), by
    listing the LoRAAdapters in a loop.

    The time a user's ``kubectl wait`` sees, not the condition's lastTransitionTime: the operator stamps
    every status of one reconcile with that reconcile's start, and at 100 writes/s the last of 10,000
    lands 100 s after its stamp (a bench that read the stamps reported 0 s). A list, not a watch: a
    starved reader's watch backlog grows, a list is the present state; the price is the resolution,
    the time between lists (``slowest_gap_s``), recorded with the results."""

    api: Api
    accepted: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    slowest_gap_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="scale-watch", daemon=True).start()

    def _run(self) -> None:
        last = None
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                items = self.api.call("GET", sr.custom("loraadapters"))["items"]
            except Exception:  # the API server too busy to answer: list again
                items = []
            seen_at = time.time()
            for obj in items:
                self._see(obj, seen_at)
            if items and last is not None:
                self.slowest_gap_s = max(self.slowest_gap_s, seen_at - last)
            last = seen_at if items else last
            self.stop.wait(max(1.0, 2 * (time.monotonic() - started)))  # at most half the time spent listing

    def _see(self, obj: dict[str, Any], seen_at: float) -> None:
        name = obj["metadata"]["name"]
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("status") == "True" and c.get("type") in ("Accepted", "Ready"):
                (self.accepted if c["type"] == "Accepted" else self.ready).setdefault(name, seen_at)

    def all_by(self, seen: dict[str, float], names: Sequence[str], since: float, timeout_s: float) -> float:
        """Seconds from ``since`` until every name is in ``seen``; raises WaitTimeout naming the count."""
        wait_until(
            f"{len(names)} adapters",
            lambda: all(n in seen for n in names),
            timeout_s,
            max_interval_s=1.0,
            describe=lambda: f"{sum(n in seen for n in names)} of {len(names)}",
        )
        return max(0.0, max(seen[n] for n in names) - since)


# --- the sidecars' reports ----------------------------------------------------------------------


def read_adapter_set(api: Api, pool: str) -> tuple[str, AdapterSet] | None:
    """(version, set) of the pool's published set as a sidecar reads it: ``<pool>-adapters`` first, then
    the shards its index names; None before it exists or while the shards do not match the index yet."""
    try:
        data = api.call("GET", sr.core("configmaps", adapters_configmap(pool))).get("data") or {}
        shards = {name: _shard_text(api, name) for name in sr.shard_names(data)}
        return sr.assemble_set(data, shards)
    except (ApiError, ValueError):  # not written yet, or a half-written update: read again
        return None


def _shard_text(api: Api, name: str) -> str | None:
    try:
        return str((api.call("GET", sr.core("configmaps", name)).get("data") or {}).get(sr.SET_KEY))
    except ApiError:
        return None


@dataclass
class Reporter:
    """Each running engine pod gets its report when its set or slot changed, as its sidecar would."""

    api: Api
    pools: Sequence[str]
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    first_at: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    _sent: dict[str, tuple[str, int | None]] = field(default_factory=dict)

    def start(self) -> None:
        threading.Thread(target=self._run, name="scale-report", daemon=True).start()

    def _run(self) -> None:
        """Every 2 s (the sidecar's default report interval): one list of the engine pods, then each pool."""
        while not self.stop.wait(2.0):
            try:
                pods = self.api.call("GET", sr.core("pods"), query=[("labelSelector", ENGINES)])["items"]
                for pool in self.pools:
                    self._pool(pool, [q for q in pods if q["metadata"]["labels"].get(INSTANCE) == pool])
            except Exception as exc:  # reported (the first few), and retried at the next round
                if len(self.errors) < 20:
                    self.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    def _pool(self, pool: str, pods: Sequence[dict[str, Any]]) -> None:
        running = [
            q for q in pods if q["status"].get("phase") == "Running" and not q["metadata"].get("deletionTimestamp")
        ]
        published = read_adapter_set(self.api, pool) if running else None
        if published is None:
            return
        version, adapter_set = published
        for pod in running:
            raw = (pod["metadata"].get("annotations") or {}).get(SLOT_ANNOTATION)
            slot = int(raw) if raw not in (None, "") else None
            if self._sent.get(pod["metadata"]["uid"]) == (version, slot):
                continue
            path, body = sr.core("pods", pod["metadata"]["name"], "status"), sr.report_patch(adapter_set, slot)
            self.api.call("PATCH", path, body, ctype="application/strategic-merge-patch+json")
            self._sent[pod["metadata"]["uid"]] = (version, slot)
            self.writes += 1
            self.first_at = self.first_at or time.time()


# --- snapshots ----------------------------------------------------------------------------------


def object_sizes(api: Api) -> list[tuple[str, str, int]]:
    """(kind, name, bytes against its limit) of every ConfigMap, LoRAPool, LoRAAdapter and Deployment here."""
    lists = {
        "ConfigMap": sr.core("configmaps"),
        "LoRAPool": sr.custom("lorapools"),
        "LoRAAdapter": sr.custom("loraadapters"),
        "Deployment": f"/apis/apps/v1/namespaces/{sr.NS}/deployments",
    }
    out = []
    for kind, path in lists.items():
        for obj in api.call("GET", path)["items"]:
            out.append((kind, obj["metadata"]["name"], sr.object_bytes(kind, obj)))
    return out


def engine_templates(api: Api, pools: Sequence[str]) -> dict[str, int]:
    """Engine ReplicaSets (one per pod template the Deployment ever had, none deleted here) per pool."""
    path = f"/apis/apps/v1/namespaces/{sr.NS}/replicasets"
    items = api.call("GET", path, query=[("labelSelector", ENGINES)])["items"]
    pairs = [((rs["metadata"].get("labels") or {}).get(INSTANCE, "?"), rs["metadata"]["name"]) for rs in items]
    counts = sr.template_counts(pairs)
    return {pool: counts.get(pool, 0) for pool in pools}


def audit_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def audit_since(log: Path, offset: int) -> dict[str, int]:
    with log.open("rb") as f:
        f.seek(offset)
        return dict(sr.audit_writes(f.read().decode(errors="replace").splitlines()))


def wait_quiet(log: Path, quiet_s: float, timeout_s: float) -> float:
    """Wait until the operator wrote nothing for ``quiet_s``; returns when its last write was (monotonic)."""
    last = {"size": audit_size(log), "at": time.monotonic()}

    def quiet() -> bool:
        size = audit_size(log)
        if size != last["size"]:
            last.update(size=size, at=time.monotonic())
        return time.monotonic() - last["at"] >= quiet_s

    wait_until(
        f"the operator to write nothing for {quiet_s:.0f} s", quiet, timeout_s, interval_s=1.0, max_interval_s=1.0
    )
    return last["at"]


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Run:
    """One benchmark run: the cluster's admin API, the operator, the watcher, what was measured."""

    p: sr.Params
    admin_kubeconfig: Path
    api: Api
    operator: Operator
    audit: Path
    source: str
    watcher: Watcher
    m: dict[str, Any] = field(default_factory=dict)
    metrics_before: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """A step that fails (a timeout, a refused write) is recorded and the run goes on to the next."""
        try:
            yield
        except (WaitTimeout, RuntimeError, OSError, ValueError) as exc:
            self.errors.append(f"{what}: {type(exc).__name__}: {str(exc)[:400]}")
            print(f"[scale] {what} failed: {exc}", flush=True)

    def create(self, docs: Sequence[tuple[str, dict[str, Any]]]) -> None:
        jobs = [lambda api, path=path, doc=doc: api.call("POST", path, doc) for path, doc in docs]
        self.errors += in_parallel(self.admin_kubeconfig, self.p.clients, jobs)[:20]


def bulk_apply(run: Run) -> None:
    """The pools and every adapter at once (pools first), by ``clients`` parallel clients; then the waits."""
    p, names = run.p, sr.adapter_names(run.p)
    every = [n for ns in names.values() for n in ns]
    run.metrics_before = run.api.metrics()
    t0, started = time.time(), time.monotonic()
    run.create([(sr.custom("lorapools"), sr.pool_doc(pool, p.replicas)) for pool in names])
    interleaved = [n for group in zip(*names.values(), strict=True) for n in group]
    pool_of = {n: pool for pool, ns in names.items() for n in ns}
    run.create([(sr.custom("loraadapters"), sr.adapter_doc(n, pool_of[n], run.source)) for n in interleaved])
    run.m.update(create_s=time.monotonic() - started, clients=p.clients)
    print(f"[scale] created {len(every)} adapters in {run.m['create_s']:.1f} s", flush=True)
    with run.step("every adapter Accepted"):
        run.m["accepted_s"] = run.watcher.all_by(run.watcher.accepted, every, t0, p.timeout_s)
    run.m["accepted_count"] = sum(n in run.watcher.accepted for n in every)
    with run.step("every set published and every engine running"):
        wait_until("sets and engines", lambda: _published(run, names), p.timeout_s, max_interval_s=3.0)
    reporter = Reporter(run.api, list(names))
    reporter.start()
    with run.step("every adapter Ready"):
        wait_until("the first report", lambda: reporter.first_at, 120)
        run.m["ready_after_reports_s"] = run.watcher.all_by(
            run.watcher.ready, every, reporter.first_at or 0.0, p.timeout_s
        )
    run.m.update(ready_count=sum(n in run.watcher.ready for n in every), report_writes=reporter.writes)
    run.m["watch_resolution_s"] = run.watcher.slowest_gap_s
    run.errors += reporter.errors[:10]
    with run.step("the operator to go quiet"):
        wait_quiet(run.audit, 15.0, p.timeout_s)
    snapshot(run, list(names))


def _published(run: Run, names: dict[str, list[str]]) -> bool:
    """Every pool's engines all running (one list) and its published set naming every adapter."""
    pods = run.api.call("GET", sr.core("pods"), query=[("labelSelector", ENGINES)])["items"]
    alive = [q for q in pods if q["status"].get("phase") == "Running" and not q["metadata"].get("deletionTimestamp")]
    running = Counter(q["metadata"]["labels"].get(INSTANCE) for q in alive)
    if any(running[pool] < run.p.replicas for pool in names):
        return False
    sets = {pool: read_adapter_set(run.api, pool) for pool in names}
    return all(
        (s := sets[pool]) is not None and set(ns) <= {a.name for a in s[1].adapters} for pool, ns in names.items()
    )


def snapshot(run: Run, pools: Sequence[str]) -> None:
    """The operator's RSS and CPU, its writes so far, the largest objects and the engine templates."""
    rss, cpu = run.operator.stats()
    writes = audit_since(run.audit, 0)
    big = sr.largest(object_sizes(run.api))
    templates = engine_templates(run.api, pools)
    run.m.update(peak_rss_mb=rss, cpu_s=cpu, writes=writes, writes_total=sr.total(writes), largest=big)
    run.m.update(largest_fraction=big[0]["fraction"] if big else None, engine_templates=templates)
    run.m.update(max_engine_templates=max(templates.values(), default=None))
    run.m["all_clients_writes"] = sr.delta(run.metrics_before, run.api.metrics())


def one_change(run: Run, name: str, pool: str) -> float:
    """Seconds from creating one more adapter in ``pool`` to its Accepted, seen by reading that one object
    every 50 ms (sub-second: the condition's lastTransitionTime has whole seconds only)."""
    t0 = time.monotonic()
    run.api.call("POST", sr.custom("loraadapters"), sr.adapter_doc(name, pool, run.source))

    def accepted() -> bool:
        conditions = (run.api.call("GET", sr.custom("loraadapters", name)).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Accepted" and c.get("status") == "True" for c in conditions)

    wait_until(f"{name} Accepted", accepted, 120, interval_s=0.05, max_interval_s=0.05, retry_on=(OSError, ApiError))
    return time.monotonic() - t0


def changes(run: Run) -> None:
    """One more adapter at this size; with many pools, one more while every other pool takes a new revision."""
    first = run.p.pool_names()[0]
    if run.p.pools == 1:
        with run.step("one more adapter"):
            run.m["one_more_s"] = one_change(run, f"{first}-extra", first)
        return
    with run.step("one change, idle"):
        run.m["change_idle_s"] = run.m["one_more_s"] = one_change(run, f"{first}-idle", first)
    patch = {"spec": {"vllm": {"env": [{"name": "BENCH_REVISION", "value": "2"}]}}}
    others, merge = run.p.pool_names()[1:], "application/merge-patch+json"
    jobs = [lambda api, p=p: api.call("PATCH", sr.custom("lorapools", p), patch, ctype=merge) for p in others]
    run.errors += in_parallel(run.admin_kubeconfig, run.p.clients, jobs)[:10]
    with run.step("one change while the other pools take a new revision"):
        run.m["change_under_load_s"] = one_change(run, f"{first}-busy", first)
    with run.step("the operator to go quiet after the revision"):
        wait_quiet(run.audit, 15.0, run.p.timeout_s)


def restart(run: Run) -> None:
    """SIGKILL the operator once it has written all it had to, start it again, and count what it writes
    until it goes quiet. Killed earlier, its queued writes (the last step's pool status) would be the
    restart's, and counted against it."""
    with run.step("the operator to go quiet before the kill"):
        wait_quiet(run.audit, 15.0, run.p.timeout_s)
    before = engine_templates(run.api, run.p.pool_names())
    statuses = pool_statuses(run.api, run.p.pool_names())
    offset = audit_size(run.audit)
    run.operator.kill()
    t0 = time.monotonic()
    with run.step("the restarted operator"):
        run.operator.start()
        every = lambda: run.operator.reconciles() >= run.p.pools  # noqa: E731 - its first pass, before quiet counts
        wait_until("the restarted operator to reconcile every pool", every, run.p.timeout_s, max_interval_s=2.0)
        run.m["restart_settled_s"] = max(0.0, wait_quiet(run.audit, 20.0, run.p.timeout_s) - t0)
    with run.step("what the restart wrote"):  # counted even when a wait above ran out: they are still writes
        by, (rss, cpu) = audit_since(run.audit, offset), run.operator.stats()
        after = engine_templates(run.api, run.p.pool_names())
        run.m.update(restart_writes=sr.total(by), restart_by=by, restart_rss_mb=rss, restart_cpu_s=cpu)
        run.m["restart_templates"] = sum(after.values()) - sum(before.values())
        now = pool_statuses(run.api, run.p.pool_names())
        run.m["restart_status_changes"] = [
            f"{pool}{line}" for pool in statuses for line in sr.changed_paths(statuses[pool], now.get(pool))
        ][:20]
        with run.audit.open("rb") as f:  # each write's own change: a flap shows even when the end state is the same
            f.seek(offset)
            patches = sr.pool_status_patches(f.read().decode(errors="replace").splitlines())
        run.m["restart_status_writes"] = [
            f"write {i + 1} {pool}{line}"
            for i, (pool, patch) in enumerate(patches[:5])
            for line in sr.changed_paths({k: statuses.get(pool, {}).get(k) for k in patch}, patch, limit=6)
        ]


def pool_statuses(api: Api, pools: Sequence[str]) -> dict[str, Any]:
    """Each pool's status as stored: the restart's pool writes are judged by what they changed."""
    return {pool: api.call("GET", sr.custom("lorapools", pool)).get("status") for pool in pools}


# --- the command --------------------------------------------------------------------------------


def tree_stamp(tree: Path) -> dict[str, Any]:
    """The operator checkout measured: its HEAD and how many files differ from it (read-only git)."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], capture_output=True, text=True).stdout
    return {"path": str(tree), "head": head, "dirty_files": len(dirty.splitlines())}


def machine() -> dict[str, Any]:
    ram_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    load = [round(x, 2) for x in os.getloadavg()]
    return {"cores": os.cpu_count(), "ram_mb": ram_mb, "kernel": platform.release(), "load_before": load}


def measure(p: sr.Params, tree: Path, work: Path) -> dict[str, Any]:
    """Start the cluster and the operator, run the scenario's steps, return the result document."""
    result: dict[str, Any] = {
        "scenario": p.scenario,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "tree": tree_stamp(tree),
        "command": shlex.join(["python", "-m", "bench.scale", *sys.argv[1:]]),
        "params": {
            "pools": p.pools,
            "adapters_per_pool": p.adapters_per_pool,
            "replicas": p.replicas,
            "clients": p.clients,
            "operator_args": list(p.operator_args),
        },
    }
    audit = work / "audit.log"
    with AuditedCluster(work / "cluster", sr.nodes_for(p.pools * p.replicas), audit) as cluster:
        sa = install(cluster, tree)
        source = "file://" + str(write_peft_adapter(work / "adapter", rank=8, base_model=sr.BASE))
        api = Api(cluster.kubeconfig)
        operator = Operator(tree, sa, work / "operator.log", p.operator_args)
        operator.start()
        watcher = Watcher(Api(cluster.kubeconfig))
        watcher.start()
        run = Run(p, cluster.kubeconfig, api, operator, audit, source, watcher)
        try:
            bulk_apply(run)
            changes(run)
            restart(run)
        finally:
            watcher.stop.set()
            operator.kill()
    result["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return {**result, "measured": run.m, "errors": run.errors, "operator_log": str(operator.log)}


def result_path(out: Path, p: sr.Params, tag: str) -> Path:
    return out / f"scale-{p.scenario}-{p.pools}x{p.adapters_per_pool}{'-' + tag if tag else ''}.json"


def main(argv: Sequence[str] | None = None) -> int:
    ap = sr.parser(REPO)
    a = ap.parse_args(argv)
    if a.report:
        print(sr.section([json.loads(f.read_text()) for f in sorted(a.out.glob("scale-*.json"))]))
        return 0
    try:
        p = sr.params_of(a)
    except ValueError as exc:
        ap.error(str(exc))
    work = a.work / f"{p.scenario}-{int(time.time())}"
    work.mkdir(parents=True)
    result = measure(p, a.operator_tree.resolve(), work)
    out = result_path(a.out, p, a.tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print("\n".join(sr.summary(result)) + f"\n\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
