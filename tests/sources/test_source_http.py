"""https:// and http:// sources against a real loopback server: errors say what to do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from loopback_http import LoopbackServer
from source_helpers import tar_of_dir

from lorapool.errors import AdapterError, SourceError
from lorapool.sources import Limits, open_source
from lorapool.sources.base import redact_url


def _download(url: str, into: Path, limits: Limits | None = None) -> None:
    into.mkdir()
    asyncio.run(open_source(url).download(into, limits=limits or Limits()))


def test_fetch_config_reads_only_the_config_of_a_directory(adapter: Path, http_server: LoopbackServer) -> None:
    url = http_server.add_dir("/d/sql", adapter)
    config = asyncio.run(open_source(url).fetch_config(limits=Limits()))
    assert config["r"] == 8
    assert http_server.hits == {"/d/sql/adapter_config.json": 1}


def test_fetch_config_of_an_archive(tmp_path: Path, adapter: Path, http_server: LoopbackServer) -> None:
    url = http_server.add_file("/a.tgz", tar_of_dir(tmp_path / "a.tgz", adapter, prefix="x/"))
    assert asyncio.run(open_source(url).fetch_config(limits=Limits()))["base_model_name_or_path"]


@pytest.mark.parametrize(
    ("status", "transient", "match"),
    [
        (503, True, "HTTP 503.*retrying"),
        (500, True, "HTTP 500"),
        (403, False, "check the URL and its credentials"),
        (404, False, "404 Not Found; publish the file"),
    ],
)
def test_http_errors_are_classified(
    tmp_path: Path, http_server: LoopbackServer, status: int, transient: bool, match: str
) -> None:
    http_server.down_status = status
    with pytest.raises(SourceError, match=match) as err:
        _download(f"{http_server.url}/a.tgz", tmp_path / "dl")
    assert err.value.transient is transient


def test_unreachable_server_is_transient(tmp_path: Path, http_server: LoopbackServer) -> None:
    url = f"{http_server.url}/a.tgz"
    http_server.stop()
    with pytest.raises(SourceError, match="retrying") as err:
        _download(url, tmp_path / "dl")
    assert err.value.transient


def test_a_stalled_server_times_out(tmp_path: Path, adapter: Path, http_server: LoopbackServer) -> None:
    http_server.add_dir("/slow", adapter)
    http_server.delay_s = 2.0
    with pytest.raises(SourceError, match="timed out") as err:
        _download(f"{http_server.url}/slow", tmp_path / "dl", Limits(read_timeout_s=0.3))
    assert err.value.transient


def test_corrupt_archive_over_http(tmp_path: Path, adapter: Path, http_server: LoopbackServer) -> None:
    data = tar_of_dir(tmp_path / "a.tgz", adapter).read_bytes()
    http_server.routes["/bad.tgz"] = data[: len(data) // 2]
    with pytest.raises(AdapterError, match=r"corrupt or truncated \(.*\); re-upload it"):
        _download(f"{http_server.url}/bad.tgz", tmp_path / "dl")


def test_missing_weights_under_a_directory_url(tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.routes["/d/adapter_config.json"] = b'{"r": 8}'
    with pytest.raises(SourceError, match="publish the adapter weights"):
        _download(f"{http_server.url}/d", tmp_path / "dl")


def test_secrets_never_appear_in_errors(tmp_path: Path, http_server: LoopbackServer) -> None:
    http_server.down_status = 503
    port = http_server.url.rsplit(":", 1)[1]
    url = f"http://user:hunter2@127.0.0.1:{port}/a.tgz?X-Amz-Signature=topsecret"
    with pytest.raises(SourceError) as err:
        _download(url, tmp_path / "dl")
    assert "hunter2" not in str(err.value) and "topsecret" not in str(err.value)
    assert redact_url(url) == f"http://127.0.0.1:{port}/a.tgz"
