"""``hf://org/repo[@revision][/subfolder]`` sources via huggingface_hub.

Honours ``HF_ENDPOINT`` (a mirror or a private hub) and ``HF_TOKEN``, both read at call
time. A download first resolves the revision to a commit (``model_info``) so every file
comes from the same commit, then fetches only the adapter files with ``hf_hub_download``.
The revision is the one in the URL or ``DesiredAdapter.revision`` (default ``main``);
naming two different ones is an error. Blocking calls run in a thread.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils.tqdm import disable_progress_bars

from lorapool.errors import AdapterError, SourceError
from lorapool.sources import archive
from lorapool.sources.base import Deadline, Downloaded, Limits
from lorapool.sources.layout import (
    BIN_FILE,
    CONFIG_FILE,
    KEPT_FILES,
    SAFETENSORS_FILE,
    parse_config_bytes,
)


def parse_hf_url(url: str) -> tuple[str, str | None, str]:
    """``hf://org/repo@rev/sub`` -> ("org/repo", "rev", "sub")."""
    rest = url.removeprefix("hf://")
    parts = rest.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise SourceError(f"{url}: expected hf://org/repo[@revision][/subfolder]", transient=False)
    repo, _, rev = parts[1].partition("@")
    sub = str(archive.member_path("/".join(parts[2:]), where=url, what="subfolder")) if parts[2:] else "."
    return f"{parts[0]}/{repo}", rev or None, "" if sub == "." else sub


class HfSource:
    """An adapter in a Hugging Face model repository (or a subfolder of one)."""

    def __init__(self, url: str, revision: str | None) -> None:
        self.url = url
        self.repo_id, url_rev, self.subfolder = parse_hf_url(url)
        if url_rev and revision and url_rev != revision:
            raise SourceError(
                f"{url}: names revision {url_rev!r} but the adapter's revision is {revision!r}; set only one",
                transient=False,
            )
        self.revision = revision or url_rev

    def describe(self) -> str:
        return self.url

    @staticmethod
    def _endpoint() -> str | None:
        return os.environ.get("HF_ENDPOINT") or None

    @staticmethod
    def _token() -> str | None:
        return os.environ.get("HF_TOKEN") or None

    def _error(self, exc: Exception) -> SourceError:
        rev = self.revision or "main"
        if isinstance(exc, GatedRepoError):
            return SourceError(
                f"{self.url}: the repository is gated; accept its license on the Hub and set HF_TOKEN",
                transient=False,
            )
        if isinstance(exc, RepositoryNotFoundError):
            return SourceError(
                f"{self.url}: repository {self.repo_id} not found or private; check the name or set HF_TOKEN",
                transient=False,
            )
        if isinstance(exc, RevisionNotFoundError):
            return SourceError(
                f"{self.url}: revision {rev!r} not found; fix spec.adapters[].revision",
                transient=False,
            )
        if isinstance(exc, LocalEntryNotFoundError):  # hub raises this when it cannot connect
            return SourceError(f"{self.url}: the Hub is unreachable ({self._endpoint() or 'huggingface.co'}); retrying")
        if isinstance(exc, EntryNotFoundError):
            return SourceError(
                f"{self.url}: file missing at revision {rev!r}; upload the adapter files",
                transient=False,
            )
        if isinstance(exc, HfHubHTTPError) and exc.response is not None:
            status = exc.response.status_code
            transient = status >= 500 or status == 429
            return SourceError(
                f"{self.url}: HTTP {status} from the Hub; {'retrying' if transient else 'check HF_TOKEN and the repo'}",
                transient=transient,
            )
        return SourceError(f"{self.url}: {type(exc).__name__}: {exc}; retrying")

    def _file(self, name: str) -> str:
        return posixpath.join(self.subfolder, name) if self.subfolder else name

    def _fetch_config(self, limits: Limits) -> dict[str, Any]:
        disable_progress_bars()
        with tempfile.TemporaryDirectory(prefix="lorapool-config-") as tmp:
            try:
                path = Path(
                    hf_hub_download(
                        self.repo_id,
                        self._file(CONFIG_FILE),
                        revision=self.revision,
                        local_dir=tmp,
                        endpoint=self._endpoint(),
                        token=self._token(),
                        etag_timeout=limits.read_timeout_s,
                    )
                )
            except (HfHubHTTPError, EntryNotFoundError, httpx2.HTTPError, OSError) as exc:
                raise self._error(exc) from exc
            if path.stat().st_size > limits.max_config_bytes:
                raise AdapterError(
                    f"{self.url}: {CONFIG_FILE} exceeds {limits.max_config_bytes} bytes; it is not a PEFT config"
                )
            return parse_config_bytes(path.read_bytes(), where=self.url)

    def _download(self, into: Path, limits: Limits) -> Downloaded:
        disable_progress_bars()
        deadline = Deadline(limits.total_timeout_s, f"{self.url}: download")
        api = HfApi(endpoint=self._endpoint(), token=self._token())
        scratch = into / "hf"
        tree = into / "tree"
        tree.mkdir()
        try:
            info = api.model_info(self.repo_id, revision=self.revision or "main", timeout=limits.read_timeout_s)
            commit = info.sha
            names = [s.rfilename for s in info.siblings or []]
            wanted = {
                posixpath.basename(n): n
                for n in names
                if posixpath.dirname(n) == self.subfolder and posixpath.basename(n) in KEPT_FILES
            }
            if SAFETENSORS_FILE in wanted:
                wanted.pop(BIN_FILE, None)
            if CONFIG_FILE not in wanted:
                where = f"{self.repo_id}/{self.subfolder}" if self.subfolder else self.repo_id
                raise SourceError(
                    f"{self.url}: no {CONFIG_FILE} in {where} at {commit or self.revision}; upload the adapter there",
                    transient=False,
                )
            total = 0
            for base, name in sorted(wanted.items()):
                deadline.check()
                path = Path(
                    hf_hub_download(
                        self.repo_id,
                        name,
                        revision=commit,
                        local_dir=scratch,
                        endpoint=self._endpoint(),
                        token=self._token(),
                        etag_timeout=min(limits.read_timeout_s, max(deadline.remaining(), 0.1)),
                    )
                )
                total += path.stat().st_size
                if total > limits.max_bytes:
                    raise AdapterError(
                        f"{self.url}: larger than the limit of {limits.max_bytes} bytes; "
                        "shrink the adapter or raise the limit"
                    )
                shutil.move(path, tree / base)
        except (HfHubHTTPError, EntryNotFoundError, httpx2.HTTPError, OSError) as exc:
            raise self._error(exc) from exc
        shutil.rmtree(scratch, ignore_errors=True)
        return Downloaded(root=tree, bytes=total, resolved_revision=commit)

    async def fetch_config(self, *, limits: Limits) -> dict[str, Any]:
        return await asyncio.to_thread(self._fetch_config, limits)

    async def download(self, into: Path, *, limits: Limits) -> Downloaded:
        return await asyncio.to_thread(self._download, into, limits)
