"""The live playground (issue 10): `lorapool dev` started in the background by a script (SIGINT
ignored) serves a `kubectl apply`-ed LoRAAdapter through its router within seconds, 404s it
after `kubectl delete`, and a SIGTERM stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lorapool.cache import cache_root
from lorapool_dev.cluster import build
from lorapool_dev.cluster.runtime import COMPONENTS
from lorapool_dev.cluster.versions import binary
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.cluster

APPLY_TO_FIRST_200_GOAL_S = 5.0
APPLY_TO_FIRST_200_LIMIT_S = 15.0  # what the test allows on a loaded 2-core CI machine; the figure is printed


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def complete(url: str, model: str) -> tuple[int, str]:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.timeout(480)
def test_playground_serves_applied_adapters_in_seconds_and_stops_on_sigterm(tmp_path: Path) -> None:
    if build.missing(cache_root(), COMPONENTS):
        pytest.fail("control plane not built; run scripts/build-control-plane")
    state = tmp_path / "dev"
    log = (tmp_path / "dev.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lorapool.cli", "dev", "--dir", str(state)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `lorapool dev &` in a script
    )
    try:
        wait_until(
            "the playground's router URL",
            lambda: (proc.poll() is not None and "exited") or (state / "router-url").exists(),
            360,
            interval_s=0.5,
        )
        assert proc.poll() is None, (tmp_path / "dev.log").read_text()[-4000:]
        url = (state / "router-url").read_text().strip()
        kubectl = [str(binary("kubectl")), f"--kubeconfig={state / 'kubeconfig'}"]
        adapter_yaml = state / "adapter.yaml"
        assert adapter_yaml.exists() and complete(url, "my-adapter")[0] == 404

        subprocess.run([*kubectl, "apply", "-f", str(adapter_yaml)], check=True, capture_output=True, timeout=60)
        applied = time.monotonic()
        wait_until("a 200 for my-adapter", lambda: complete(url, "my-adapter")[0] == 200, 60, interval_s=0.1)
        first_200_s = time.monotonic() - applied
        print(
            f"apply -> first 200 through the playground's router: {first_200_s:.2f} s (goal {APPLY_TO_FIRST_200_GOAL_S:g} s)"
        )
        assert first_200_s <= APPLY_TO_FIRST_200_LIMIT_S
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Ready", "loraadapter/my-adapter", "-n", "ml", "--timeout=30s"],
            check=True,
            capture_output=True,
            timeout=60,
        )

        subprocess.run([*kubectl, "delete", "-f", str(adapter_yaml)], check=True, capture_output=True, timeout=60)
        deleted = time.monotonic()
        _, body = wait_until(
            "a 404 for the deleted adapter", lambda: (r := complete(url, "my-adapter"))[0] == 404 and r, 60
        )
        print(f"delete -> 404: {time.monotonic() - deleted:.2f} s; body: {body[:200]}")

        # A rank-64 adapter changes vLLM's flags: the engine pods roll, the playground follows them
        # (new engines with the new flags) and the same router URL serves it.
        wide = write_peft_adapter(tmp_path / "wide", rank=64, base_model="meta-llama/Meta-Llama-3-8B-Instruct")
        doc = {"apiVersion": "lorapool.io/v1alpha1", "kind": "LoRAAdapter", "metadata": {"name": "wide", "namespace": "ml"},
               "spec": {"poolRef": {"name": "llama3-8b"}, "source": f"file://{wide}"}}  # fmt: skip
        subprocess.run(
            [*kubectl, "apply", "-f", "-"], input=json.dumps(doc), text=True, check=True, capture_output=True
        )
        applied = time.monotonic()
        wait_until("a 200 for wide after the roll", lambda: complete(url, "wide")[0] == 200, 120, interval_s=0.2)
        print(f"apply of a rank-64 adapter (pods roll) -> first 200: {time.monotonic() - applied:.2f} s")
        # wide's first 200 may come from the first new engine while the roll goes on (the router
        # restarts in front of each new set of engines): wait for sql-coder on the rolled pool too.
        wait_until(
            "a 200 for sql-coder after the roll", lambda: complete(url, "sql-coder")[0] == 200, 120, interval_s=0.2
        )

        started = descendants(proc.pid)
        assert len(started) >= 8, started  # control plane, operator, sims, sidecars, router
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, (tmp_path / "dev.log").read_text()[-4000:]
        wait_until("every process it started gone", lambda: not [p for p in started if alive(p)], 20)
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, "the router's port is still held"
        assert not (state / "router-url").exists()
    finally:
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(timeout=30)
        log.close()
