"""The catalogue-scale benchmark's pure parts (issue 44 item 4): targets, verdicts, write counts, report.

``bench/scale.py`` measures; this module judges and prints, over plain data, so it is tested without
a cluster (tests/bench/test_scale.py). The targets are the issue's ("Targets (this 2-core machine)"),
one per measured value, so a results file says PASS or MISS beside each number rather than leaving
the reader to compare by eye.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.formatting import fmt
from lorapool.api.adapterset import AdapterSet
from lorapool.api.report import ANNOTATION, SYNCED_CONDITION, encode
from lorapool.sidecar.core import AdapterState, Phase, identity_of  # type: ignore[attr-defined]  # the probe's names
from lorapool.sidecar.podreport import replica_report, synced_condition
from lorapool_dev.cluster.manifests import A100_80GB, FakeNode

MIB = 1024 * 1024
CONFIGMAP_LIMIT = MIB  # the API server refuses a ConfigMap whose data exceeds 1 MiB
ETCD_REQUEST_LIMIT = 3 * MIB // 2  # etcd's default --max-request-bytes: the limit of every other object
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
ONE_POOL, MANY_POOLS = "one-pool", "many-pools"
GROUP, VERSION, NS = "lorapool.io", "v1alpha1", "scale"
OPERATOR_USER = "system:serviceaccount:lorapool-system:lorapool-operator"
BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


# --- the scenario and its objects ---------------------------------------------------------------

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [  # the pools' status writes with their bodies: what a restart's writes changed
        {
            "level": "Request",
            "users": [OPERATOR_USER],
            "verbs": ["patch"],
            "resources": [{"group": "lorapool.io", "resources": ["lorapools/status"]}],
        },
        {"level": "Metadata", "users": [OPERATOR_USER], "verbs": sorted(WRITE_VERBS)},
        {"level": "None"},
    ],
}


@dataclass(frozen=True)
class Params:
    pools: int
    adapters_per_pool: int
    replicas: int
    clients: int
    timeout_s: float
    operator_args: tuple[str, ...] = ()

    @property
    def scenario(self) -> str:
        return MANY_POOLS if self.pools > 1 else ONE_POOL

    def pool_names(self) -> list[str]:
        return ["big"] if self.pools == 1 else [f"p{i:03d}" for i in range(self.pools)]


def parser(repo: Path) -> argparse.ArgumentParser:
    """The command's flags (``bench/scale.py``'s docstring shows the two scenarios)."""
    ap = argparse.ArgumentParser(
        prog="python -m bench.scale", description="Catalogue scale: the real operator at 10,000 adapters."
    )
    ap.add_argument("--adapters", type=int, help="adapters in one pool (the one-pool scenario)")
    ap.add_argument(
        "--pools", type=int, default=1, help="pools in the namespace (more than 1: the many-pools scenario)"
    )
    ap.add_argument("--adapters-per-pool", type=int, default=100)
    ap.add_argument("--replicas", type=int, help="engine replicas per pool (default 16 for one pool, 1 for many)")
    ap.add_argument("--clients", type=int, default=6, help="parallel clients creating the adapters")
    ap.add_argument(
        "--timeout-s", type=float, default=600.0, help="bound of each wait (a miss is recorded, the run goes on)"
    )
    ap.add_argument("--operator-tree", type=Path, default=repo, help="the checkout whose operator, CRDs and RBAC run")
    ap.add_argument("--out", type=Path, default=repo / "bench" / "results")
    ap.add_argument("--tag", default="", help="suffix of the results file, e.g. 'base'")
    ap.add_argument(
        "--work", type=Path, default=Path("/tmp/lorapool-scale"), help="cluster state, audit and operator logs"
    )
    ap.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more flag for the operator, e.g. --operator-arg=--status-write-qps=400 (repeatable)",
    )
    ap.add_argument("--report", action="store_true", help="print the RESULTS.md section of OUT/scale-*.json and exit")
    return ap


def params_of(a: argparse.Namespace) -> Params:
    """The scenario from the flags; a ValueError names the flag that cannot work."""
    if a.adapters is not None and a.pools != 1:
        raise ValueError("--adapters is the one-pool scenario: with --pools N give --adapters-per-pool")
    per_pool = a.adapters if a.adapters is not None else a.adapters_per_pool
    for flag, value in (("--pools", a.pools), ("--adapters/--adapters-per-pool", per_pool), ("--clients", a.clients)):
        if value < 1:
            raise ValueError(f"{flag}={value}: must be at least 1")
    if a.replicas is not None and a.replicas < 1:
        raise ValueError(f"--replicas={a.replicas}: must be at least 1")
    if a.timeout_s <= 0:
        raise ValueError(f"--timeout-s={a.timeout_s}: must be positive")
    replicas = a.replicas or (16 if a.pools == 1 else 1)
    return Params(a.pools, per_pool, replicas, a.clients, a.timeout_s, tuple(a.operator_arg))


def pool_doc(name: str, replicas: int, env: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    spec = {
        "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
        "gpu": {"product": "A100-80GB", "count": 1},
        "replicas": replicas,
        "lora": {"maxLoras": "auto", "maxLoraRank": "auto", "maxCpuLoras": "auto"},
        # 10,000 adapters over 16 replicas is 625 a replica: the default pod memory (weights + 32 GiB)
        # caches 615 rank-8 adapters, so 160 would fit nowhere (the pool says so); 64 GiB caches ~900.
        "vllm": {
            "maxModelLen": 8192, "gpuMemoryUtilization": 0.9, "env": list(env),
            "resources": {"limits": {"memory": "64Gi"}, "requests": {"memory": "64Gi"}},
        },
    }  # fmt: skip
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LoRAPool", "metadata": {"name": name}, "spec": spec}


def adapter_doc(name: str, pool: str, source: str) -> dict[str, Any]:
    spec = {"poolRef": {"name": pool}, "source": source}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LoRAAdapter", "metadata": {"name": name}, "spec": spec}


def adapter_names(p: Params) -> dict[str, list[str]]:
    """pool -> its adapters' names; names are unique in the namespace (LoRAAdapter names are ids)."""
    return {pool: [f"{pool}-a{i:05d}" for i in range(p.adapters_per_pool)] for pool in p.pool_names()}


def report_patch(adapter_set: AdapterSet, slot: int | None) -> dict[str, Any]:
    """The pod status patch a sidecar sends once its share of the set is all loaded."""
    desired = {a.name: a for a in adapter_set.share(slot).adapters}
    state = {n: AdapterState(n, phase=Phase.LOADED, loaded=identity_of(a)) for n, a in desired.items()}
    report = replica_report(desired, state, {}, engine_healthy=True)
    synced = synced_condition(True, set(desired), state)
    condition = {
        "type": SYNCED_CONDITION,
        "status": str(synced.status),
        "reason": synced.reason,
        "message": synced.message,
    }
    return {"metadata": {"annotations": {ANNOTATION: encode(report)}}, "status": {"conditions": [condition]}}


def custom(kind: str, name: str | None = None, sub: str | None = None) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{kind}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def core(kind: str, name: str | None = None, sub: str | None = None) -> str:
    return f"/api/v1/namespaces/{NS}/{kind}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def nodes_for(gpus: int) -> list[FakeNode]:
    """A100-80GB KWOK nodes with twice the GPUs the pools ask for (a rolling update surges), one CPU node."""
    count = max(2, math.ceil(2 * gpus / 8))
    gpu_nodes = [
        FakeNode(
            f"gpu-{i}",
            pods="250",
            gpu_product=A100_80GB,
            gpu_memory_mib=81920,
            gpu_count=8,
            internal_ip=f"10.240.{1 + i // 200}.{10 + i % 200}",
        )
        for i in range(count)
    ]
    return [*gpu_nodes, FakeNode("cpu-0", cpu="96", memory="512Gi", pods="250", internal_ip="10.240.0.30")]


SET_KEY, INDEX_KEY = "adapters.json", "index.json"  # of ``<pool>-adapters`` (and of each shard: SET_KEY)


def shard_names(data: Mapping[str, str]) -> list[str]:
    """The shard ConfigMaps the index in ``<pool>-adapters``'s data names; none for an inline set."""
    return [s["name"] for s in json.loads(data[INDEX_KEY]).get("shards", [])] if INDEX_KEY in data else []


def assemble_set(data: Mapping[str, str], shards: Mapping[str, str | None]) -> tuple[str, AdapterSet]:
    """(version, set) from the index ConfigMap's data and each named shard's text, read as the sidecar
    reads them: plain JSON here, so the harness also reads a tree older or newer than its own ``lorapool``.

    A set without an index (before issue 44) is its ``adapters.json``. A shard missing or not matching
    the index's sha256 raises ValueError: the update is half-written, never acted on."""
    if INDEX_KEY not in data:
        return hashlib.sha256(data[SET_KEY].encode()).hexdigest(), AdapterSet.from_json(data[SET_KEY])
    index = json.loads(data[INDEX_KEY])
    if not index.get("shards"):
        return index["generation"], AdapterSet.from_json(data[SET_KEY])
    docs = []
    for ref in index["shards"]:
        text = shards.get(ref["name"])
        if text is None or hashlib.sha256(text.encode()).hexdigest() != ref["sha256"]:
            raise ValueError(f"shard {ref['name']} does not match generation {index['generation'][:12]} yet")
        docs.append(json.loads(text))
    whole = {**docs[0], "adapters": [a for d in docs for a in d.get("adapters", [])]}
    return index["generation"], AdapterSet.model_validate(whole)


def peak_rss_mb(proc_status: str) -> float:
    """VmHWM (the peak resident set) of a /proc/PID/status text, in MB."""
    for line in proc_status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError("/proc/PID/status has no VmHWM line: not a Linux process status")


def cpu_seconds(proc_stat: str, ticks_per_s: int) -> float:
    """utime + stime of a /proc/PID/stat text (fields 14 and 15; the command name may hold spaces)."""
    fields = proc_stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


# --- targets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One of the issue's targets: the measured key, its bound, and which side of it passes."""

    key: str
    label: str
    bound: float
    unit: str
    at_most: bool = True  # PASS when value <= bound (else value >= bound)
    scenarios: tuple[str, ...] = (ONE_POOL, MANY_POOLS)


TARGETS: tuple[Target, ...] = (
    Target("accepted_s", "every adapter Accepted, from the first create", 90.0, "s", scenarios=(ONE_POOL,)),
    Target("ready_after_reports_s", "every adapter Ready, from the reports", 30.0, "s", scenarios=(ONE_POOL,)),
    Target("peak_rss_mb", "operator peak RSS", 300.0, "MB", scenarios=(ONE_POOL,)),
    Target("largest_fraction", "largest object written, share of its limit", 0.5, ""),
    Target(
        "change_under_load_s", "one change Accepted while the other pools re-revise", 1.0, "s", scenarios=(MANY_POOLS,)
    ),
    Target("max_engine_templates", "engine pod templates per pool in the bulk apply", 1.0, ""),
    Target("restart_writes", "writes after an operator SIGKILL + restart", 0.0, "", scenarios=(ONE_POOL,)),
)


def judge(value: float | None, target: Target) -> str:
    """PASS / MISS, or "-" when the value was not measured (a failed step: its error says why)."""
    if value is None:
        return "-"
    ok = value <= target.bound if target.at_most else value >= target.bound
    return "PASS" if ok else "MISS"


@dataclass(frozen=True)
class Row:
    label: str
    measured: str
    target: str
    verdict: str


def verdicts(result: Mapping[str, Any]) -> list[Row]:
    """One row per target that applies to the result's scenario, the value beside its bound."""
    measured = result.get("measured", {})
    rows = []
    for t in TARGETS:
        if result.get("scenario") not in t.scenarios:
            continue
        value = measured.get(t.key)
        digits = 3 if t.key == "largest_fraction" else (0 if t.unit in ("", "MB") else 2)
        unit = f" {t.unit}" if t.unit else ""
        rows.append(
            Row(t.label, fmt(value, digits) + unit, f"{'<=' if t.at_most else '>='} {t.bound:g}{unit}", judge(value, t))
        )
    return rows


# --- API writes ---------------------------------------------------------------------------------


def _kind(resource: str, subresource: str) -> str:
    return f"{resource}/{subresource}" if subresource else resource


def pool_status_patches(lines: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """(pool, the status it was patched with) of each pool status write in audit lines, in order."""
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        ref, body = event.get("objectRef") or {}, event.get("requestObject")
        if event.get("stage") != "ResponseComplete" or not isinstance(body, dict):
            continue
        if ref.get("resource") == "lorapools" and ref.get("subresource") == "status":
            out.append((str(ref.get("name")), body.get("status") or {}))
    return out


def audit_writes(lines: Iterable[str]) -> Counter[str]:
    """Write requests in kube-apiserver audit lines (JSON events), keyed "resource[/sub] verb code".

    The policy logs only the operator's account, so every counted line is an operator write; reads
    and unparseable lines (a line cut by a concurrent append) are left out."""
    counts: Counter[str] = Counter()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
            continue
        ref = event.get("objectRef") or {}
        code = (event.get("responseStatus") or {}).get("code", "?")
        counts[f"{_kind(ref.get('resource', '?'), ref.get('subresource', ''))} {event['verb']} {code}"] += 1
    return counts


def request_totals(metrics_text: str) -> Counter[str]:
    """``apiserver_request_total`` write samples of a /metrics page, keyed "resource[/sub] VERB code".

    Every client counts here (the harness, KWOK, the controllers): context for the audit counts."""
    counts: Counter[str] = Counter()
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
        labels = dict(_label(part) for part in _split_labels(labels_text))
        if labels.get("verb", "").lower() not in WRITE_VERBS | {"post", "put", "apply"}:
            continue
        key = f"{_kind(labels.get('resource', '?'), labels.get('subresource', ''))} {labels['verb']} {labels.get('code', '?')}"
        counts[key] += int(float(value))
    return counts


def _split_labels(text: str) -> list[str]:
    """`a="x",b="y,z"` -> ['a="x"', 'b="y,z"']: commas inside quotes are not separators."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in text:
        if ch == "," and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
        if ch == '"' and not escaped:
            quoted = not quoted
        escaped = ch == "\\" and not escaped
    if current:
        parts.append("".join(current))
    return parts


def _label(part: str) -> tuple[str, str]:
    name, _, value = part.partition("=")
    return name.strip(), value.strip().strip('"')


def unix_time(rfc3339: str | None) -> float | None:
    """A condition's lastTransitionTime ("2026-12-07T17:51:19Z") in Unix seconds; None when absent or unreadable."""
    try:
        return datetime.datetime.fromisoformat(str(rfc3339).replace("Z", "+00:00")).timestamp() if rfc3339 else None
    except ValueError:
        return None


def metric_sum(metrics_text: str, name: str) -> float:
    """The sum of every sample of metric ``name`` (all label sets) on a /metrics page; 0 when absent."""
    out = 0.0
    for line in metrics_text.splitlines():
        if line.startswith((name + "{", name + " ")):
            out += float(line.rsplit(" ", 1)[1])
    return out


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """What grew between two counter snapshots (a counter that vanished or shrank counts 0)."""
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0) > 0}


def total(counts: Mapping[str, int], *, ok_only: bool = False) -> int:
    """The sum of write counts; ``ok_only`` keeps the 2xx ones (a refused write wrote nothing)."""
    return sum(v for k, v in counts.items() if not ok_only or k.rsplit(" ", 1)[-1].startswith("2"))


# --- objects ------------------------------------------------------------------------------------


def object_limit(kind: str) -> int:
    return CONFIGMAP_LIMIT if kind == "ConfigMap" else ETCD_REQUEST_LIMIT


def object_bytes(kind: str, obj: Mapping[str, Any]) -> int:
    """The size the object's limit applies to: a ConfigMap's keys and values (the API server's 1 MiB rule;
    its JSON would count each escaped quote twice), any other object's compact JSON (what etcd stores)."""
    if kind == "ConfigMap":
        data = {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}
        return sum(len(k.encode()) + len(str(v).encode()) for k, v in data.items())
    return len(json.dumps(obj, separators=(",", ":")))


def largest(objects: Iterable[tuple[str, str, int]], top: int = 5) -> list[dict[str, Any]]:
    """The ``top`` (kind, name, bytes) nearest their limit, each with its limit and share of it."""
    rows: list[dict[str, Any]] = [
        {"kind": kind, "name": name, "bytes": size, "limit": object_limit(kind), "fraction": size / object_limit(kind)}
        for kind, name, size in objects
    ]
    return sorted(rows, key=lambda r: -float(r["fraction"]))[:top]


def changed_paths(before: Any, after: Any, path: str = "", limit: int = 20) -> list[str]:
    """Where two JSON documents differ, as ``path: before -> after`` lines (values clipped): what a
    write after a restart changed, so a rewrite names its cause."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after)):
            out += changed_paths(before.get(key), after.get(key), f"{path}.{key}", limit - len(out))
            if len(out) >= limit:
                break
        return out[:limit]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out += changed_paths(b, a, f"{path}[{i}]", limit - len(out))
        return out[:limit]
    if before == after:
        return []
    return [f"{path or '.'}: {json.dumps(before)[:120]} -> {json.dumps(after)[:120]}"]


def template_counts(replicasets: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Distinct engine pod templates per pool from (pool, ReplicaSet name) pairs: one per ReplicaSet."""
    seen: dict[str, set[str]] = {}
    for pool, rs in replicasets:
        seen.setdefault(pool, set()).add(rs)
    return {pool: len(names) for pool, names in sorted(seen.items())}


# --- the report ---------------------------------------------------------------------------------


def table(rows: Sequence[Row]) -> list[str]:
    out = ["| measured | value | target | verdict |", "| --- | ---: | ---: | --- |"]
    return out + [f"| {r.label} | {r.measured} | {r.target} | {r.verdict} |" for r in rows]


def summary(result: Mapping[str, Any]) -> list[str]:
    """The result as Markdown: where and what it measured, the targets, then the other numbers."""
    m, params, machine, tree = result["measured"], result["params"], result["machine"], result["tree"]
    dirty = f", {tree['dirty_files']} uncommitted file(s)" if tree.get("dirty_files") else ""
    lines = [
        f"### {result['scenario']}: {params['pools']} pool(s) x {params['adapters_per_pool']} adapters, "
        f"{params['replicas']} replica(s) each",
        "",
        f"`{result['command']}` on {result['date']}, operator at `{tree['head'][:7]}`{dirty} ({tree['path']}); "
        f"{machine['cores']} cores, {machine['ram_mb']} MB RAM, load {machine['load_before']} before, "
        f"{machine['load_after']} after.",
        "",
        *table(verdicts(result)),
        "",
        *_details(m),
    ]
    return (
        lines + [f"- note: {n}" for n in result.get("notes", [])] + [f"- error: {e}" for e in result.get("errors", [])]
    )


def _details(m: Mapping[str, Any]) -> list[str]:
    writes = m.get("writes") or {}
    top = sorted(writes.items(), key=lambda kv: -kv[1])[:8]
    big = m.get("largest") or []
    lines = [
        f"- adapters Accepted by the end of that wait: {m.get('accepted_count')} (all in {fmt(m.get('accepted_s'), 1)} s from the first create); "
        f"Ready by the end of that wait: {m.get('ready_count')} (all in {fmt(m.get('ready_after_reports_s'), 1)} s from the reports); "
        f"created in {fmt(m.get('create_s'), 1)} s by {m.get('clients')} clients; Accepted and Ready as a "
        f"client saw them, listing every {fmt(m.get('watch_resolution_s'), 1)} s at most",
        f"- operator CPU {fmt(m.get('cpu_s'), 1)} s, peak RSS {fmt(m.get('peak_rss_mb'), 0)} MB; "
        f"after restart CPU {fmt(m.get('restart_cpu_s'), 1)} s, peak RSS {fmt(m.get('restart_rss_mb'), 0)} MB",
        f"- one more adapter Accepted in {fmt(m.get('one_more_s'))} s; one change idle {fmt(m.get('change_idle_s'))} s, "
        f"under load {fmt(m.get('change_under_load_s'))} s",
        f"- engine pod templates per pool: max {m.get('max_engine_templates')}, after restart +{fmt(m.get('restart_templates'), 0)}",
        f"- operator writes: {total(writes)} ({', '.join(f'{k}: {v}' for k, v in top)})",
        f"- after restart: {fmt(m.get('restart_writes'), 0)} ({', '.join(f'{k}: {v}' for k, v in (m.get('restart_by') or {}).items())})",
        *(f"- rewritten by the restart: `{line}`" for line in m.get("restart_status_changes") or []),
        *(f"- a restart's pool status write: `{line}`" for line in m.get("restart_status_writes") or []),
    ]
    lines += [
        f"- largest: {b['kind']} {b['name']} {b['bytes']} B ({b['fraction']:.1%} of {b['limit']})" for b in big[:3]
    ]
    return lines


def section(results: Sequence[Mapping[str, Any]]) -> str:
    """The RESULTS.md section for the scale results files, newest run of each scenario and tree first."""
    ordered = sorted(results, key=lambda r: str(r.get("date")), reverse=True)
    body: list[str] = []
    for r in ordered:
        body += [*summary(r), ""]
    return "\n".join(body).rstrip() + "\n"
