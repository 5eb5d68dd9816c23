"""A small client of the OCI distribution API (pull and push), on aiohttp, for ``oci://`` sources
and ``lorapool adapter push``.

Why hand-written rather than oras-py (``oras`` on PyPI, evaluated at 0.2.43): it is synchronous
(requests), so the async sidecar would run it in threads with no shared ``Deadline``; it writes a
blob to disk and checks its digest afterwards, where we need the size limit and the sha256 enforced
while streaming (``Sink``) so an oversized or tampered layer is cut off, not stored; it logs through
its own logger (pushed/pulled containers, with references) and pulls ``requests`` and ``jsonschema``
into the image. What we need of the API is five requests (manifest GET/PUT, blob GET/HEAD, a
monolithic upload) and the token flow: about 200 lines we can bound and test against a real registry.

Auth: a request answered 401 is retried once with the challenge's scheme: ``Bearer`` (the token
flow: GET the realm with service and scope, Basic credentials when we have them) or ``Basic``.
Credentials come from a docker config document (``auths``), looked up by the registry's host[:port].
A second 401 is ``unauthorized``. Nothing here logs; messages name the registry and repository,
never a credential or a token.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from lorapool.api.schemes import OCI
from lorapool.errors import AdapterError, SourceError
from lorapool.sources.base import Deadline, Limits, Sink
from lorapool.sources.download import ChecksumMismatch

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MAX_MANIFEST_BYTES = 4 << 20  # the distribution spec's suggested manifest limit
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Reference:
    """``oci://REGISTRY[:PORT]/REPOSITORY(:TAG|@sha256:DIGEST|:TAG@sha256:DIGEST)``: the digest, when
    given, is what is pulled (the tag is then a label only, as docker reads it)."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, url: str) -> Reference:
        if not re.fullmatch(OCI.adapter.regex, url, re.ASCII):
            raise SourceError(f"{url}: {OCI.adapter.message}", transient=False)
        registry, _, rest = url.removeprefix("oci://").partition("/")
        rest, _, digest = rest.partition("@")
        repository, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
        return cls(registry, repository, tag or None, digest or None)

    @property
    def ref(self) -> str:
        """What the manifest is fetched by: the digest when pinned, else the tag."""
        return self.digest or self.tag or ""

    def __str__(self) -> str:
        return (
            f"oci://{self.registry}/{self.repository}"
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


@dataclass(frozen=True)
class Login:
    username: str
    password: str

    def basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


# Docker Hub is named docker.io in references, keyed https://index.docker.io/v1/ by docker login, and
# served from registry-1.docker.io.
_DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def api_host(registry: str) -> str:
    """The host[:port] that serves ``registry``'s distribution API."""
    return "registry-1.docker.io" if registry in _DOCKER_HUB else registry


def login_for(docker_config: Mapping[str, Any], registry: str) -> Login | None:
    """The credentials a docker config document (``{"auths": {...}}``) holds for ``registry``
    (host[:port]; keys written as URLs match too); None when it has none."""
    auths = docker_config.get("auths")
    if not isinstance(auths, Mapping):
        return None
    for key, entry in auths.items():
        host = re.sub(r"^https?://", "", str(key)).split("/")[0]
        same = host == registry or (host in _DOCKER_HUB and registry in _DOCKER_HUB)
        if not same or not isinstance(entry, Mapping):
            continue
        if entry.get("username") and entry.get("password"):
            return Login(str(entry["username"]), str(entry["password"]))
        if entry.get("auth"):
            try:
                user, colon, password = base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
                if not colon:
                    raise ValueError("no ':'")
            except (ValueError, UnicodeDecodeError):
                raise SourceError(
                    f"the docker config's entry for {registry}: 'auth' is not base64 of user:password; "
                    "recreate the Secret with kubectl create secret docker-registry",
                    transient=False,
                ) from None
            return Login(user, password)
    return None


def parse_docker_config(raw: str, *, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise SourceError(
            f'{where}: not JSON; it must be a docker config ({{"auths": ...}})', transient=False
        ) from None
    if not isinstance(doc, dict):
        raise SourceError(f"{where}: not a JSON object; it must be a docker config", transient=False)
    return doc


class _ManifestUnknown(SourceError):
    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, params = header.strip().partition(" ")
    return scheme.lower(), dict(_CHALLENGE_PARAM.findall(params))


class RegistryClient:
    """One registry's API for one repository, with its auth; use as ``async with``."""

    def __init__(
        self,
        ref: Reference,
        *,
        login: Login | None,
        plain_http: bool,
        ca_file: Path | None,
        limits: Limits,
        deadline: Deadline,
    ) -> None:
        self.ref = ref
        self.login = login
        self.base = f"{'http' if plain_http else 'https'}://{api_host(ref.registry)}/v2/{ref.repository}"
        self.where = f"oci://{ref.registry}/{ref.repository}"
        self.plain_http = plain_http
        self.limits = limits
        self.deadline = deadline
        self._ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self._authorization: str | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RegistryClient:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.limits.connect_timeout_s, sock_read=self.limits.read_timeout_s
        )
        self._session = aiohttp.ClientSession(timeout=timeout, raise_for_status=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @asynccontextmanager
    async def request(self, method: str, url: str, *, what: str, **kw: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request, retried once after a 401 with the challenge's credentials; raises the named
        SourceError of a failure status (404 unknown, 401/403 unauthorized, 5xx transient)."""
        assert self._session is not None
        headers = dict(kw.pop("headers", {}))
        try:
            async with asyncio.timeout(self.deadline.remaining()):
                for attempt in range(2):
                    if self._authorization:
                        headers["Authorization"] = self._authorization
                    resp = await self._session.request(method, url, headers=headers, ssl=self._ssl, **kw)
                    if resp.status == 401 and attempt == 0:
                        header = resp.headers.get("WWW-Authenticate", "")
                        resp.release()
                        await self._authorize(header, what=what)
                        continue
                    try:
                        await self._raise_for(resp, what=what)
                        yield resp
                    finally:
                        resp.release()
                    return
        except TimeoutError as exc:
            raise SourceError(f"{what}: timed out; check the registry or raise the timeout") from exc
        except aiohttp.ClientSSLError as exc:
            raise SourceError(
                f"{what}: TLS failed ({type(exc).__name__}); give the registry's CA, or list {self.ref.registry} "
                "in spec.credentials.oci.plainHTTP if it serves plain HTTP",
                transient=False,
            ) from exc
        except aiohttp.ClientError as exc:
            raise SourceError(f"{what}: {type(exc).__name__}: {exc}; retrying") from exc

    async def _authorize(self, header: str, *, what: str) -> None:
        scheme, params = _challenge(header)
        if scheme == "basic":
            if self.login is None:
                raise self._unauthorized(what, "the registry asks for a login and none is configured")
            self._authorization = self.login.basic()
            return
        if scheme != "bearer" or "realm" not in params:
            raise self._unauthorized(what, f"the registry's challenge {scheme or 'none'!r} is not Basic nor Bearer")
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        headers = {"Authorization": self.login.basic()} if self.login else {}
        assert self._session is not None
        async with self._session.get(params["realm"], params=query, headers=headers, ssl=self._ssl) as resp:
            if resp.status in (401, 403):
                raise self._unauthorized(what, f"the token service refused the login (HTTP {resp.status})")
            if resp.status != 200:
                raise SourceError(f"{what}: the registry's token service answered HTTP {resp.status}; retrying")
            body = await resp.content.read(1 << 20)
        try:
            token = json.loads(body).get("token") or json.loads(body).get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise SourceError(f"{what}: the registry's token service sent no token; retrying")
        self._authorization = f"Bearer {token}"

    def _unauthorized(self, what: str, why: str) -> SourceError:
        return SourceError(
            f"{what}: unauthorized: {why}; put a login for {self.ref.registry} in the kubernetes.io/dockerconfigjson "
            "Secret spec.credentials.oci.secretName names (lorapool adapter push: docker login, or --username)",
            transient=False,
        )

    async def _raise_for(self, resp: aiohttp.ClientResponse, *, what: str) -> None:
        if resp.status < 400:
            return
        codes = await _error_codes(resp)
        if resp.status == 401 or resp.status == 403:
            raise self._unauthorized(what, f"HTTP {resp.status} {' '.join(codes)}".strip())
        if resp.status == 404:
            if "NAME_UNKNOWN" in codes:
                why = f"unknown repository {self.ref.repository!r} (NAME_UNKNOWN); push the adapter or fix the source"
            elif "MANIFEST_UNKNOWN" in codes:
                raise _ManifestUnknown(
                    f"{what}: no manifest {self.ref.ref!r} in the repository (MANIFEST_UNKNOWN); push that tag or fix it"
                )
            else:
                why = f"not found (HTTP 404 {' '.join(codes)}); check the registry, repository and tag"
            raise SourceError(f"{what}: {why}", transient=False)
        transient = resp.status in _TRANSIENT_STATUS
        fix = "retrying" if transient else "check the reference and the registry"
        raise SourceError(
            f"{what}: HTTP {resp.status} {' '.join(codes)}; {fix}".replace("  ", " "), transient=transient
        )

    # ---- pull ------------------------------------------------------------------------------

    async def manifest(self, ref: str) -> tuple[bytes, str, str]:
        """The manifest ``ref`` (tag or digest): its bytes, media type and digest (sha256 of the bytes,
        checked against a digest ``ref`` and the registry's Docker-Content-Digest)."""
        what = f"{self.where}: manifest {ref}"
        accept = ", ".join((*MANIFEST_TYPES, *INDEX_TYPES))
        try:
            async with self.request("GET", f"{self.base}/manifests/{ref}", what=what, headers={"Accept": accept}) as r:
                body = await r.content.read(MAX_MANIFEST_BYTES + 1)
                media_type = r.headers.get("Content-Type", "").split(";")[0].strip()
                told = r.headers.get("Docker-Content-Digest")
        except _ManifestUnknown:
            # Some registries (distribution 2.x) say MANIFEST_UNKNOWN for a repository that does not exist:
            # its tag list tells the two apart (NAME_UNKNOWN).
            async with self.request("GET", f"{self.base}/tags/list?n=1", what=f"{self.where}: tags"):
                pass
            raise
        if len(body) > MAX_MANIFEST_BYTES:
            raise AdapterError(f"{what}: the manifest exceeds {MAX_MANIFEST_BYTES} bytes; it is not an adapter's")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        expected = ref if ref.startswith("sha256:") else told
        if expected and expected != digest:
            raise ChecksumMismatch(
                f"{what}: digest mismatch: the registry sent a manifest of {digest}, not {expected}; "
                "the registry or a proxy altered it: fix the registry, or re-push the adapter"
            )
        return body, media_type, digest

    async def blob(self, digest: str, size: int, dest: Path, *, limit: int, what: str) -> int:
        """Stream blob ``digest`` into ``dest``, refusing it past ``limit`` or ``size`` bytes and unless
        its sha256 is ``digest``; return its bytes."""
        if not _DIGEST.match(digest):
            raise AdapterError(f"{what}: digest {digest!r} is not sha256:<64 hex>; only sha256 blobs are pulled")
        if size > limit:
            raise AdapterError(
                f"{what}: layer of {size} bytes exceeds the limit of {limit}; shrink the adapter or raise the "
                "download size limit"
            )
        async with self.request("GET", f"{self.base}/blobs/{digest}", what=what) as resp:
            with dest.open("wb") as fh:
                sink = Sink(fh, limit_bytes=min(limit, size), what=what, deadline=self.deadline)
                async for chunk in resp.content.iter_chunked(1 << 20):
                    sink.write(chunk)
        if f"sha256:{sink.sha256}" != digest or sink.bytes != size:  # the caller's staging dir is dropped whole
            raise ChecksumMismatch(
                f"{what}: digest mismatch: got {sink.bytes} bytes of sha256:{sink.sha256}, the manifest says "
                f"{size} bytes of {digest}; the blob is corrupt or was replaced: re-push the adapter"
            )
        return sink.bytes

    # ---- push ------------------------------------------------------------------------------

    async def has_blob(self, digest: str) -> bool:
        try:
            async with self.request("HEAD", f"{self.base}/blobs/{digest}", what=f"{self.where}: blob {digest}"):
                return True
        except SourceError as exc:
            if "unauthorized" in str(exc) or exc.transient:
                raise
            return False

    async def push_blob(self, path: Path | bytes, digest: str, size: int) -> None:
        """A monolithic upload (POST, then PUT with the digest), skipped when the registry has it."""
        if await self.has_blob(digest):
            return
        what = f"{self.where}: upload of {digest}"
        async with self.request("POST", f"{self.base}/blobs/uploads/", what=what) as resp:
            location = resp.headers.get("Location", "")
        if not location:
            raise SourceError(f"{what}: the registry gave no upload location; check the registry", transient=False)
        url = str(self._session_url(location))
        sep = "&" if "?" in url else "?"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if isinstance(path, bytes):
            async with self.request("PUT", f"{url}{sep}digest={digest}", what=what, headers=headers, data=path):
                return
        with path.open("rb") as fh:
            async with self.request("PUT", f"{url}{sep}digest={digest}", what=what, headers=headers, data=fh):
                return

    def _session_url(self, location: str) -> str:
        if location.startswith(("http://", "https://")):
            return location
        scheme = "http" if self.plain_http else "https"
        return f"{scheme}://{api_host(self.ref.registry)}{location}"

    async def push_manifest(self, body: bytes, media_type: str, tag: str) -> None:
        what = f"{self.where}: manifest {tag}"
        headers = {"Content-Type": media_type}
        async with self.request("PUT", f"{self.base}/manifests/{tag}", what=what, headers=headers, data=body):
            return


async def _error_codes(resp: aiohttp.ClientResponse) -> list[str]:
    """The distribution API's error codes of a failure's body (``{"errors": [{"code": ...}]}``)."""
    try:
        doc = json.loads(await resp.content.read(64 << 10))
        return [str(e["code"]) for e in doc.get("errors", []) if isinstance(e, dict) and "code" in e]
    except (ValueError, AttributeError, aiohttp.ClientError):
        return []
