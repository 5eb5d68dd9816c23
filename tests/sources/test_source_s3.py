"""s3:// against a real S3-compatible server (moto in server mode on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path
from typing import Any

import boto3
import pytest
from source_helpers import tar_of_dir

from lorapool.errors import SourceError
from lorapool.sources import AdapterStore, ConfigCache, Downloader, fetch_adapter_config


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="adapters")
    yield client
    for obj in client.list_objects_v2(Bucket="adapters").get("Contents", []):
        client.delete_object(Bucket="adapters", Key=obj["Key"])
    client.delete_bucket(Bucket="adapters")


def test_prefix_download_and_config(s3: Any, tmp_path: Path, adapter: Path) -> None:
    for f in adapter.iterdir():
        s3.put_object(Bucket="adapters", Key=f"team/sql/{f.name}", Body=f.read_bytes())
    s3.put_object(Bucket="adapters", Key="team/sql/checkpoint-100/optimizer.pt", Body=b"x")
    s3.put_object(Bucket="adapters", Key="team/sql-other/adapter_config.json", Body=b"{}")
    weights_sha = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    fetched = asyncio.run(
        Downloader(AdapterStore(tmp_path / "a")).fetch("sql", "s3://adapters/team/sql", sha256=weights_sha)
    )
    assert sorted(p.name for p in fetched.path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = asyncio.run(fetch_adapter_config("s3://adapters/team/sql/", cache=ConfigCache()))
    assert config["r"] == 8


def test_archive_object(s3: Any, tmp_path: Path, adapter: Path) -> None:
    archive = tar_of_dir(tmp_path / "sql.tgz", adapter, prefix="sql/")
    s3.upload_fileobj(io.BytesIO(archive.read_bytes()), "adapters", "sql.tgz")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    fetched = asyncio.run(Downloader(AdapterStore(tmp_path / "a")).fetch("sql", "s3://adapters/sql.tgz", sha256=sha))
    assert fetched.config["r"] == 8
    assert asyncio.run(fetch_adapter_config("s3://adapters/sql.tgz", cache=None))["r"] == 8


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("s3://adapters/missing", "no adapter_config.json under the prefix; upload the adapter"),
        ("s3://no-such-bucket/x", "NoSuchBucket: the bucket does not exist"),
        ("s3://adapters/missing.tgz", "NoSuchKey: the object does not exist"),
    ],
)
def test_missing_objects_are_permanent_with_a_fix(s3: Any, tmp_path: Path, url: str, match: str) -> None:
    with pytest.raises(SourceError, match=match) as err:
        asyncio.run(Downloader(AdapterStore(tmp_path / "a")).fetch("sql", url))
    assert not err.value.transient


def test_endpoint_down_is_transient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with pytest.raises(SourceError, match="check AWS_ENDPOINT_URL") as err:
        asyncio.run(fetch_adapter_config("s3://adapters/x", cache=None, timeout_s=20))
    assert err.value.transient
