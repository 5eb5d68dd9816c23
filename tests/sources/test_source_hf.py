"""hf:// through the real huggingface_hub client against a local hub (HF_ENDPOINT)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub, Repo

from lorapool.errors import SourceError
from lorapool.sources import AdapterStore, Downloader, fetch_adapter_config
from lorapool.sources.hf import parse_hf_url


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    server = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield server
    server.stop()


def _files(adapter: Path, prefix: str = "") -> dict[str, bytes]:
    return {prefix + f.name: f.read_bytes() for f in adapter.iterdir()}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("hf://org/repo", ("org/repo", None, "")),
        ("hf://org/repo@v1", ("org/repo", "v1", "")),
        ("hf://org/repo@v1/adapters/sql", ("org/repo", "v1", "adapters/sql")),
        ("hf://org/repo/sub/", ("org/repo", None, "sub")),
    ],
)
def test_parse_hf_url(url: str, expected: tuple[str, str | None, str]) -> None:
    assert parse_hf_url(url) == expected


def test_download_resolves_the_revision_and_fetches_only_adapter_files(
    hub: FakeHub, tmp_path: Path, adapter: Path
) -> None:
    repo = hub.repos["org/sql"] = Repo()
    v1 = repo.add_commit({**_files(adapter), "README.md": b"# sql", "training_args.bin": b"x"}, ref="v1")
    weights_sha = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    fetched = asyncio.run(
        Downloader(AdapterStore(tmp_path / "a")).fetch("sql", "hf://org/sql", revision="v1", sha256=weights_sha)
    )
    assert fetched.origin.resolved_revision == v1
    assert sorted(p.name for p in fetched.path.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert hub.hits[f"/org/sql/resolve/{v1}/README.md"] == 0
    assert hub.hits["/api/models/org/sql/revision/v1"] == 1


def test_subfolder_and_revision_in_the_url(hub: FakeHub, tmp_path: Path, adapter: Path) -> None:
    repo = hub.repos["org/many"] = Repo()
    config = json.loads((adapter / "adapter_config.json").read_text())
    repo.add_commit({**_files(adapter, "sql/"), "chat/adapter_config.json": json.dumps({**config, "r": 16}).encode()})
    repo.add_commit({**_files(adapter, "sql/")}, ref="old")
    fetched = asyncio.run(Downloader(AdapterStore(tmp_path / "a")).fetch("sql", "hf://org/many@old/sql"))
    assert fetched.config["r"] == 8
    assert asyncio.run(fetch_adapter_config("hf://org/many/chat", cache=None))["r"] == 16


def test_hf_token_is_sent(hub: FakeHub, tmp_path: Path, adapter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = hub.repos["org/private"] = Repo(token="hf_secret_token")
    repo.add_commit(_files(adapter))
    with pytest.raises(SourceError, match="not found or private; check the name or set HF_TOKEN") as err:
        asyncio.run(fetch_adapter_config("hf://org/private", cache=None))
    assert not err.value.transient and "hf_secret_token" not in str(err.value)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token")
    assert asyncio.run(fetch_adapter_config("hf://org/private", cache=None))["r"] == 8
    assert asyncio.run(Downloader(AdapterStore(tmp_path / "a")).fetch("p", "hf://org/private")).config["r"] == 8


@pytest.mark.parametrize(
    ("url", "revision", "match"),
    [
        ("hf://org/sql", "nope", "revision 'nope' not found"),
        ("hf://org/none", None, "repository org/none not found"),
        ("hf://org/sql/empty", None, "no adapter_config.json in org/sql/empty"),
        ("hf://org/sql@v1", "v2", "names revision 'v1' but the adapter's revision is 'v2'"),
    ],
)
def test_hub_errors_are_permanent_with_a_fix(
    hub: FakeHub, tmp_path: Path, adapter: Path, url: str, revision: str | None, match: str
) -> None:
    hub.repos["org/sql"] = Repo()
    hub.repos["org/sql"].add_commit(_files(adapter))
    with pytest.raises(SourceError, match=match) as err:
        asyncio.run(Downloader(AdapterStore(tmp_path / "a")).fetch("sql", url, revision=revision))
    assert not err.value.transient


def test_hub_down_is_transient(hub: FakeHub, tmp_path: Path) -> None:
    hub.stop()
    with pytest.raises(SourceError) as err:
        asyncio.run(Downloader(AdapterStore(tmp_path / "a")).fetch("sql", "hf://org/sql"))
    assert err.value.transient
