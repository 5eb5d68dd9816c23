"""``s3://bucket/prefix`` sources via boto3, for AWS and any S3-compatible store.

The endpoint comes from ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (then path-style
addressing, which MinIO, Ceph and moto expect), credentials from the standard AWS
environment/config chain. A key ending in .tar.gz/.tgz/.tar/.zip is one archive; any
other prefix is a directory whose adapter files sit directly under ``prefix/``.
boto3 blocks, so every call runs in a thread, bounded by botocore's own timeouts and
checked against the overall deadline between chunks.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.config
import botocore.exceptions

from lorapool.errors import AdapterError, SourceError
from lorapool.sources import archive
from lorapool.sources.base import Deadline, Downloaded, Limits, Sink
from lorapool.sources.layout import CONFIG_FILE, KEPT_FILES, parse_config_bytes

_DENIED = "access denied; grant s3:GetObject and s3:ListBucket to the credentials in use"
_PERMANENT_CODES = {
    "NoSuchBucket": "the bucket does not exist; create it or fix the source",
    "NoSuchKey": "the object does not exist; upload it or fix the source",
    "404": "the object does not exist; upload it or fix the source",
    "AccessDenied": _DENIED,
    "403": _DENIED,
    "InvalidAccessKeyId": "the access key is unknown; fix AWS_ACCESS_KEY_ID in spec.credentials",
    "SignatureDoesNotMatch": "the secret key is wrong; fix AWS_SECRET_ACCESS_KEY",
}


class S3Source:
    """An adapter in an S3 bucket: one archive object or the files under a prefix."""

    def __init__(self, url: str, revision: str | None) -> None:
        parts = urlsplit(url)
        self.url = url
        self.revision = revision
        self.bucket = parts.netloc
        self.key = parts.path.lstrip("/")
        self.kind = archive.archive_kind(self.key)
        self._client: Any = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.url

    def _s3(self, limits: Limits) -> Any:
        with self._lock:  # boto3 sessions are not thread-safe to create; clients are to use
            if self._client is None:
                endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                config = botocore.config.Config(
                    connect_timeout=limits.connect_timeout_s,
                    read_timeout=limits.read_timeout_s,
                    retries={"max_attempts": 2, "mode": "standard"},
                    s3={"addressing_style": "path" if endpoint else "auto"},
                )
                region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=endpoint, region_name=region, config=config
                )
            return self._client

    def _error(self, exc: Exception, key: str) -> Exception:
        where = f"s3://{self.bucket}/{key}"
        if isinstance(exc, botocore.exceptions.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _PERMANENT_CODES:
                return SourceError(f"{where}: {code}: {_PERMANENT_CODES[code]}", transient=False)
            return SourceError(f"{where}: {code or 'error'}: {exc}; retrying")
        if isinstance(exc, botocore.exceptions.NoCredentialsError):
            return SourceError(
                f"{where}: no S3 credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (spec.credentials)",
                transient=False,
            )
        return SourceError(f"{where}: {type(exc).__name__}: {exc}; check AWS_ENDPOINT_URL and the network, retrying")

    def _get(self, key: str, dest: Path, *, limits: Limits, limit: int, deadline: Deadline) -> Sink:
        try:
            obj = self._s3(limits).get_object(Bucket=self.bucket, Key=key)
            size = obj.get("ContentLength")
            if size is not None and size > limit:
                raise AdapterError(
                    f"s3://{self.bucket}/{key}: {size} bytes exceeds the limit of {limit}; "
                    "shrink the adapter or raise the limit"
                )
            body = obj["Body"]
            with dest.open("wb") as fh:
                sink = Sink(fh, limit_bytes=limit, what=f"s3://{self.bucket}/{key}", deadline=deadline)
                for chunk in body.iter_chunks(1 << 20):
                    sink.write(chunk)
            body.close()
            return sink
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc, key) from exc

    def _list(self, prefix: str, limits: Limits) -> list[str]:
        try:
            resp = self._s3(limits).list_objects_v2(Bucket=self.bucket, Prefix=prefix, Delimiter="/", MaxKeys=1000)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc, prefix) from exc
        return [obj["Key"] for obj in resp.get("Contents", [])]

    def _prefix(self) -> str:
        return self.key.rstrip("/") + "/" if self.key else ""

    def _fetch_config(self, limits: Limits) -> dict[str, Any]:
        deadline = Deadline(limits.config_timeout_s, f"{self.url}: {CONFIG_FILE}")
        with tempfile.TemporaryDirectory(prefix="lorapool-config-") as tmp:
            if self.kind is None:
                dest = Path(tmp) / CONFIG_FILE
                self._get(
                    self._prefix() + CONFIG_FILE,
                    dest,
                    limits=limits,
                    limit=limits.max_config_bytes,
                    deadline=deadline,
                )
                return parse_config_bytes(dest.read_bytes(), where=self.url)
            dest = Path(tmp) / "archive"
            self._get(self.key, dest, limits=limits, limit=limits.max_bytes, deadline=deadline)
            out = Path(tmp) / "tree"
            out.mkdir()
            archive.extract(dest, out, limits=limits, where=self.url, kind=self.kind, config_only=True)
            found = sorted(out.rglob(CONFIG_FILE), key=lambda p: len(p.parts))
            if not found:
                raise AdapterError(f"{self.url}: the archive holds no {CONFIG_FILE}; add it")
            return parse_config_bytes(found[0].read_bytes(), where=self.url)

    def _download(self, into: Path, limits: Limits) -> Downloaded:
        deadline = Deadline(limits.total_timeout_s, f"{self.url}: download")
        tree = into / "tree"
        tree.mkdir()
        if self.kind is not None:
            dest = into / "archive"
            sink = self._get(self.key, dest, limits=limits, limit=limits.max_bytes, deadline=deadline)
            archive.extract(dest, tree, limits=limits, where=self.url, kind=self.kind, deadline=deadline)
            dest.unlink()
            return Downloaded(root=tree, bytes=sink.bytes, archive_sha256=sink.sha256)
        keys = [k for k in self._list(self._prefix(), limits) if k.rsplit("/", 1)[-1] in KEPT_FILES]
        if not any(k.endswith("/" + CONFIG_FILE) or k == CONFIG_FILE for k in keys):
            raise SourceError(
                f"{self.url}: no {CONFIG_FILE} under the prefix; "
                f"upload the adapter to s3://{self.bucket}/{self._prefix()}",
                transient=False,
            )
        total = 0
        for key in sorted(keys):
            name = key.rsplit("/", 1)[-1]
            total += self._get(key, tree / name, limits=limits, limit=limits.max_bytes - total, deadline=deadline).bytes
        return Downloaded(root=tree, bytes=total)

    async def fetch_config(self, *, limits: Limits) -> dict[str, Any]:
        return await asyncio.to_thread(self._fetch_config, limits)

    async def download(self, into: Path, *, limits: Limits) -> Downloaded:
        return await asyncio.to_thread(self._download, into, limits)
