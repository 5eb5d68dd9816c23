"""Kept files of unloaded adapters, measured at the sidecar with a remote source: the real sidecar
and the real simulator as processes, adapters on an S3-compatible server (moto in server mode on
127.0.0.1). An adapter is loaded, removed from the set (unloaded), put back: with keeping on the
place-back downloads nothing; with keeping off it downloads again; a budget smaller than two
adapters evicts the least recently used.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from sidecar_procs import NOT_YET, ConfigMapDir, Sidecar, adapter_set, engine_adapters, metric_samples, start_sidecar

from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.processes import RunningProcess
from lorapool_dev.testing.wait import WaitTimeout, wait_until

pytestmark = pytest.mark.slow

NAMES = ("sql", "chat")


@pytest.fixture
def bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    """Adapters sql and chat under s3://adapters/<name>/ (the sidecar process inherits the env);
    yields the size of one adapter's files."""
    for key, value in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    client: Any = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="adapters")
    sizes = set()
    for seed, name in enumerate(NAMES, start=1):
        src = write_peft_adapter(tmp_path / f"src-{name}", seed=seed)
        sizes.add(sum(f.stat().st_size for f in src.iterdir()))
        for f in src.iterdir():
            client.put_object(Bucket="adapters", Key=f"{name}/{f.name}", Body=f.read_bytes())
    (size,) = sizes
    yield size
    for obj in client.list_objects_v2(Bucket="adapters").get("Contents", []):
        client.delete_object(Bucket="adapters", Key=obj["Key"])
    client.delete_bucket(Bucket="adapters")


def _config(cfg: ConfigMapDir, *names: str) -> None:
    cfg.write(adapter_set([{"name": n, "source": f"s3://adapters/{n}/"} for n in names]))


def _held(sidecar: Sidecar, engine_port: int, *names: str) -> None:
    """Wait until the engine holds exactly ``names``, each Loaded."""
    wait_until(f"engine holds {names}", lambda: set(engine_adapters(engine_port)) == set(names), 20, retry_on=NOT_YET)
    for name in names:
        sidecar.wait_phase(name, "Loaded")


def _counts(sidecar: Sidecar) -> dict[str, float]:
    text = sidecar.metrics()
    return {
        "downloads": metric_samples(text, "lorapool_sidecar_download_seconds_count").get("", 0.0),
        "hits": metric_samples(text, "lorapool_sidecar_kept_hits_total").get("", 0.0),
        "kept_bytes": metric_samples(text, "lorapool_sidecar_kept_bytes").get("", 0.0),
    }


def _wait_counts(sidecar: Sidecar, expected: dict[str, float]) -> None:
    """The counts settle just after the last phase change (the gauge follows the store's tidy-up)."""
    try:
        wait_until(f"counts {expected}", lambda: _counts(sidecar) == expected, 10, retry_on=NOT_YET)
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}; counts {_counts(sidecar)}\n{sidecar.proc.output()[-3000:]}") from None


def _serves(engine_port: int, name: str) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{engine_port}/v1/completions",
        data=json.dumps({"model": name, "prompt": "hi", "max_tokens": 2}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["model"] == name


def _round_trip(tmp_path: Path, engine_port: int, *flags: str) -> Sidecar:
    """Load sql and chat, remove sql, put it back; return the sidecar, still running."""
    cfg = ConfigMapDir(tmp_path / "cfg")
    _config(cfg, *NAMES)
    sidecar = start_sidecar(cfg.path, engine_port, tmp_path / "adapters", *flags)
    _held(sidecar, engine_port, *NAMES)
    _config(cfg, "chat")
    _held(sidecar, engine_port, "chat")
    _config(cfg, *NAMES)
    _held(sidecar, engine_port, *NAMES)
    _serves(engine_port, "sql")
    return sidecar


def test_a_place_back_loads_kept_files_without_a_download(
    tmp_path: Path, bucket: int, sim: RunningProcess, engine_port: int
) -> None:
    sidecar = _round_trip(tmp_path, engine_port)
    try:
        _wait_counts(sidecar, {"downloads": 2.0, "hits": 1.0, "kept_bytes": 0.0})  # sql's files are in use again
        assert "Reused kept adapter files" in sidecar.proc.output()
    finally:
        sidecar.proc.close()


def test_keeping_off_downloads_again(tmp_path: Path, bucket: int, sim: RunningProcess, engine_port: int) -> None:
    sidecar = _round_trip(tmp_path, engine_port, "--keep-unloaded-bytes", "0")
    try:
        _wait_counts(sidecar, {"downloads": 3.0, "hits": 0.0, "kept_bytes": 0.0})
        assert not (tmp_path / "adapters" / ".kept").exists() or not list((tmp_path / "adapters" / ".kept").iterdir())
    finally:
        sidecar.proc.close()


def test_a_budget_smaller_than_two_adapters_evicts_the_older(
    tmp_path: Path, bucket: int, sim: RunningProcess, engine_port: int
) -> None:
    size = bucket
    cfg = ConfigMapDir(tmp_path / "cfg")
    _config(cfg, *NAMES)
    sidecar = start_sidecar(cfg.path, engine_port, tmp_path / "adapters", "--keep-unloaded-bytes", str(size * 3 // 2))
    try:
        _held(sidecar, engine_port, *NAMES)
        _config(cfg, "chat")  # sql unloaded first: the older kept tree
        _held(sidecar, engine_port, "chat")
        wait_until("sql kept", lambda: _counts(sidecar)["kept_bytes"] == size, 10, retry_on=NOT_YET)
        _config(cfg)  # then chat: two trees do not fit, sql's goes
        _held(sidecar, engine_port)
        wait_until("sql evicted", lambda: "Evicted kept adapter files" in sidecar.proc.output(), 10)
        evicted = metric_samples(sidecar.metrics(), "lorapool_sidecar_kept_evictions_total")
        assert evicted == {'reason="bytes"': 1.0}
        _wait_counts(sidecar, {"downloads": 2.0, "hits": 0.0, "kept_bytes": size})

        _config(cfg, *NAMES)  # chat comes back from its kept files, sql from the source
        _held(sidecar, engine_port, *NAMES)
        _wait_counts(sidecar, {"downloads": 3.0, "hits": 1.0, "kept_bytes": 0.0})
        _serves(engine_port, "sql")
        _serves(engine_port, "chat")
    finally:
        sidecar.proc.close()
