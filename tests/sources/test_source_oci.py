"""oci:// sources against a real CNCF distribution registry on 127.0.0.1 (lorapool_dev.testing.registry):
both packagings, tag and digest identities, auth (Basic, the Bearer token flow), TLS, and every bad
input refused by a named reason with nothing left in the store."""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.schemes import OCI
from lorapool.errors import AdapterError, SourceError, UnsafePathError
from lorapool.sources.base import Deadline, Downloaded, Limits
from lorapool.sources.download import ChecksumMismatch, Downloader
from lorapool.sources.layout import CONFIG_FILE, SAFETENSORS_FILE
from lorapool.sources.oci import OciSource
from lorapool.sources.oci_client import Login, Reference, RegistryClient, api_host, login_for
from lorapool.sources.oci_push import EMPTY, EMPTY_TYPE, push_adapter
from lorapool.sources.store import AdapterStore
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.peft import write_peft_adapter
from lorapool_dev.testing.registry import Registry, run_registry
from lorapool_dev.testing.wait import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("plain")) as registry:
        yield registry


@pytest.fixture(scope="module")
def basic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("basic"), auth="htpasswd") as registry:
        yield registry


@pytest.fixture(params=["basic", "token_tls"])
def with_auth(request: pytest.FixtureRequest) -> Registry:
    """Each registry that asks for a login (set up before the test's call, which owns no thread of it)."""
    registry: Registry = request.getfixturevalue(request.param)
    return registry


@pytest.fixture(scope="module")
def token_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp("token"), auth="token", tls=True) as registry:
        yield registry


def _files(directory: Path) -> dict[str, Path]:
    return {p.name: p for p in directory.iterdir()}


def _login(registry: Registry) -> Login | None:
    return Login(registry.username, registry.password) if registry.username and registry.password else None


def _push(registry: Registry, adapter: Path, reference: str) -> str:
    ref = Reference.parse(reference)
    return asyncio.run(
        push_adapter(
            _files(adapter), ref, login=_login(registry), plain_http=registry.plain_http, ca_file=registry.ca_file
        )
    )


def _source(registry: Registry, url: str, *, login: Login | None = None, ca: bool = True) -> OciSource:
    plain = frozenset({registry.host}) if registry.plain_http else frozenset()
    return OciSource(
        url, None, login=login or _login(registry), plain_http=plain, ca_file=registry.ca_file if ca else None
    )


def _download(source: OciSource, into: Path, limits: Limits | None = None) -> Downloaded:
    into.mkdir()
    return asyncio.run(source.download(into, limits=limits or Limits()))


async def _push_raw(registry: Registry, repository: str, blobs: list[bytes], manifest: dict[str, Any]) -> str:
    """Push ``blobs`` and ``manifest`` as given (for packagings and bad manifests our push never writes)."""
    ref = Reference(registry.host, repository, "v1", None)
    limits = Limits()
    client = RegistryClient(
        ref,
        login=_login(registry),
        plain_http=registry.plain_http,
        ca_file=registry.ca_file,
        limits=limits,
        deadline=Deadline(60, "push"),
    )
    body = json.dumps(manifest).encode()
    async with client:
        for blob in [EMPTY, *blobs]:
            await client.push_blob(blob, _digest(blob), len(blob))
        await client.push_manifest(body, manifest["mediaType"], "v1")
    return _digest(body)


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _manifest(layers: list[dict[str, Any]], media_type: str = "application/vnd.oci.image.manifest.v1+json") -> Any:
    config = {"mediaType": EMPTY_TYPE, "digest": _digest(EMPTY), "size": len(EMPTY)}
    return {"schemaVersion": 2, "mediaType": media_type, "config": config, "layers": layers}


def _layer(data: bytes, media_type: str, title: str | None = None) -> dict[str, Any]:
    layer: dict[str, Any] = {"mediaType": media_type, "digest": _digest(data), "size": len(data)}
    return layer | ({"annotations": {"org.opencontainers.image.title": title}} if title else {})


def _tar(members: dict[str, bytes], *, gz: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0) if gz else buf.getvalue()


# --- identity: a tag resolves to a digest, a digest pins ----------------------------------------


def test_a_tag_resolves_to_the_manifest_digest_and_a_moved_tag_is_a_new_version(
    tmp_path: Path, plain: Registry
) -> None:
    first = write_peft_adapter(tmp_path / "a1", rank=8)
    digest = _push(plain, first, f"oci://{plain.host}/team/sql-coder:v1")
    assert digest.startswith("sha256:") and len(digest) == 71
    config = asyncio.run(_source(plain, f"oci://{plain.host}/team/sql-coder:v1").fetch_config(limits=Limits()))
    assert config["r"] == 8
    got = _download(_source(plain, f"oci://{plain.host}/team/sql-coder:v1"), tmp_path / "d1")
    assert got.resolved_revision == digest
    assert sorted(p.name for p in got.root.iterdir()) == [CONFIG_FILE, SAFETENSORS_FILE]
    assert (got.root / SAFETENSORS_FILE).read_bytes() == (first / SAFETENSORS_FILE).read_bytes()

    moved = _push(plain, write_peft_adapter(tmp_path / "a2", rank=16), f"oci://{plain.host}/team/sql-coder:v1")
    assert moved != digest
    assert (
        _download(_source(plain, f"oci://{plain.host}/team/sql-coder:v1"), tmp_path / "d2").resolved_revision == moved
    )
    pinned = _download(_source(plain, f"oci://{plain.host}/team/sql-coder@{digest}"), tmp_path / "d3")
    assert pinned.resolved_revision == digest  # the digest still names the first push's files
    assert (pinned.root / SAFETENSORS_FILE).read_bytes() == (first / SAFETENSORS_FILE).read_bytes()


def test_pushing_the_same_files_again_gives_the_same_digest(tmp_path: Path, plain: Registry) -> None:
    adapter = write_peft_adapter(tmp_path / "a", rank=8)
    assert _push(plain, adapter, f"oci://{plain.host}/same:v1") == _push(plain, adapter, f"oci://{plain.host}/same:v2")


def test_the_store_keeps_a_tag_identity_it_verified_when_the_tag_moves(
    tmp_path: Path, plain: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's Downloader: the same source (a tag) is reused from the store, never re-fetched
    and swapped under the adapter; the store's origin records the digest it resolved to."""
    monkeypatch.setenv("LORAPOOL_OCI_PLAIN_HTTP", plain.host)
    url = f"oci://{plain.host}/kept:v1"
    digest = _push(plain, write_peft_adapter(tmp_path / "a1", rank=8), url)
    downloader = Downloader(AdapterStore(tmp_path / "store"))
    fetched = asyncio.run(downloader.fetch("sql", url))
    assert fetched.origin.resolved_revision == digest and fetched.config["r"] == 8
    downloader.store.point("sql", fetched.origin)
    downloader.release(fetched)
    _push(plain, write_peft_adapter(tmp_path / "a2", rank=16), url)
    again = asyncio.run(downloader.fetch("sql", url))
    assert again.cached and again.origin.resolved_revision == digest and again.config["r"] == 8


# --- the packagings --------------------------------------------------------------------------


def test_an_image_packed_adapter_is_unpacked_from_its_layers(tmp_path: Path, plain: Registry) -> None:
    adapter = write_peft_adapter(tmp_path / "a", rank=8)
    config_layer = _tar({"adapter/adapter_config.json": (adapter / CONFIG_FILE).read_bytes()}, gz=False)
    weights_layer = _tar({"adapter/adapter_model.safetensors": (adapter / SAFETENSORS_FILE).read_bytes()})
    manifest = _manifest(
        [
            _layer(config_layer, "application/vnd.docker.image.rootfs.diff.tar"),
            _layer(weights_layer, "application/vnd.docker.image.rootfs.diff.tar.gzip"),
        ],
        media_type="application/vnd.docker.distribution.manifest.v2+json",
    )
    manifest["config"]["mediaType"] = "application/vnd.docker.container.image.v1+json"
    digest = asyncio.run(_push_raw(plain, "packed", [config_layer, weights_layer], manifest))
    source = _source(plain, f"oci://{plain.host}/packed:v1")
    assert asyncio.run(source.fetch_config(limits=Limits()))["r"] == 8
    got = _download(source, tmp_path / "dl")
    assert got.resolved_revision == digest
    assert (got.root / "adapter" / SAFETENSORS_FILE).read_bytes() == (adapter / SAFETENSORS_FILE).read_bytes()


def test_a_modelpack_artifact_is_read_by_its_titles(tmp_path: Path, plain: Registry) -> None:
    adapter = write_peft_adapter(tmp_path / "a", rank=8)
    config, weights = (adapter / CONFIG_FILE).read_bytes(), (adapter / SAFETENSORS_FILE).read_bytes()
    manifest = _manifest(
        [
            _layer(config, "application/vnd.cncf.model.weight.config.v1.raw", CONFIG_FILE),
            _layer(weights, "application/vnd.cncf.model.weight.v1.raw", SAFETENSORS_FILE),
            _layer(b"# readme", "application/vnd.cncf.model.doc.v1.raw", "README.md"),  # not pulled
        ]
    )
    asyncio.run(_push_raw(plain, "modelpack", [config, weights, b"# readme"], manifest))
    got = _download(_source(plain, f"oci://{plain.host}/modelpack:v1"), tmp_path / "dl")
    assert sorted(p.name for p in got.root.iterdir()) == [CONFIG_FILE, SAFETENSORS_FILE]
    assert got.bytes == len(config) + len(weights)


# --- bad inputs: each by its reason, nothing in the store ------------------------------------


def _fetch_into_store(tmp_path: Path, registry: Registry, url: str, monkeypatch: pytest.MonkeyPatch) -> Exception:
    monkeypatch.setenv("LORAPOOL_OCI_PLAIN_HTTP", registry.host)
    store = AdapterStore(tmp_path / "store")
    with pytest.raises((AdapterError, SourceError)) as err:
        asyncio.run(Downloader(store).fetch("bad", url))
    assert list(store.store_dir.iterdir()) == [] and list(store.staging_dir.iterdir()) == []
    assert store.current("bad") is None
    return err.value


def test_an_unknown_repository_and_an_unknown_tag_are_named(
    tmp_path: Path, plain: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    _push(plain, write_peft_adapter(tmp_path / "a", rank=8), f"oci://{plain.host}/known:v1")
    repo = _fetch_into_store(tmp_path / "r", plain, f"oci://{plain.host}/nobody/here:v1", monkeypatch)
    assert "unknown repository 'nobody/here' (NAME_UNKNOWN)" in str(repo)
    assert isinstance(repo, SourceError) and not repo.transient
    tag = _fetch_into_store(tmp_path / "t", plain, f"oci://{plain.host}/known:v9", monkeypatch)
    assert "no manifest 'v9' in the repository (MANIFEST_UNKNOWN)" in str(tag)


def test_a_tampered_blob_is_a_digest_mismatch(tmp_path: Path, plain: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = write_peft_adapter(tmp_path / "a", rank=8, seed=7)
    _push(plain, adapter, f"oci://{plain.host}/tampered:v1")
    blob = plain.blob_path(_digest((adapter / SAFETENSORS_FILE).read_bytes()))
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte off: only the digest can tell
    blob.write_bytes(bytes(data))
    err = _fetch_into_store(tmp_path, plain, f"oci://{plain.host}/tampered:v1", monkeypatch)
    assert isinstance(err, ChecksumMismatch)  # the sidecar's failure reason: checksum
    assert "digest mismatch" in str(err) and "re-push the adapter" in str(err)


def test_a_manifest_with_no_adapter_files_is_refused(
    tmp_path: Path, plain: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = _manifest([_layer(b"hello", "text/plain", "README.md")])
    asyncio.run(_push_raw(plain, "empty", [b"hello"], manifest))
    err = _fetch_into_store(tmp_path, plain, f"oci://{plain.host}/empty:v1", monkeypatch)
    assert "the manifest holds no adapter files" in str(err)


def test_a_layer_over_the_size_limit_is_refused_before_download(tmp_path: Path, plain: Registry) -> None:
    _push(plain, write_peft_adapter(tmp_path / "a", rank=8), f"oci://{plain.host}/big:v1")
    with pytest.raises(AdapterError, match=r"layer of \d+ bytes exceeds the limit of \d+; shrink the adapter"):
        _download(_source(plain, f"oci://{plain.host}/big:v1"), tmp_path / "dl", Limits(max_bytes=1000))


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        ({"../adapter_config.json": b"{}"}, "contains '..'"),
        ({"/etc/adapter_config.json": b"{}"}, "is an absolute path"),
    ],
)
def test_a_path_traversal_in_a_layer_tar_is_refused(
    tmp_path: Path, plain: Registry, monkeypatch: pytest.MonkeyPatch, layers: dict[str, bytes], match: str
) -> None:
    layer = _tar(layers)
    repo = f"evil{len(match)}"
    asyncio.run(
        _push_raw(plain, repo, [layer], _manifest([_layer(layer, "application/vnd.oci.image.layer.v1.tar+gzip")]))
    )
    err = _fetch_into_store(tmp_path, plain, f"oci://{plain.host}/{repo}:v1", monkeypatch)
    assert isinstance(err, UnsafePathError) and match in str(err)


def test_a_path_traversal_in_a_layer_title_is_refused(tmp_path: Path, plain: Registry) -> None:
    manifest = _manifest([_layer(b"{}", "application/json", "../../adapter_config.json")])
    asyncio.run(_push_raw(plain, "evil-title", [b"{}"], manifest))
    with pytest.raises(UnsafePathError, match=r"layer title '\.\./\.\./adapter_config\.json' contains '\.\.'"):
        _download(_source(plain, f"oci://{plain.host}/evil-title:v1"), tmp_path / "dl")


# --- auth and transport ------------------------------------------------------------------------


def test_a_login_reaches_a_registry_with_auth(tmp_path: Path, with_auth: Registry) -> None:
    registry = with_auth
    digest = _push(registry, write_peft_adapter(tmp_path / "a", rank=8), f"oci://{registry.host}/auth:v1")
    # The sidecar's way: a docker config document, as a kubernetes.io/dockerconfigjson Secret holds it.
    plain = frozenset({registry.host}) if registry.plain_http else frozenset()
    source = OciSource(
        f"oci://{registry.host}/auth:v1",
        None,
        docker_config=registry.docker_config(),
        plain_http=plain,
        ca_file=registry.ca_file,
    )
    assert _download(source, tmp_path / "dl").resolved_revision == digest


@pytest.mark.parametrize("login", [None, Login("lorapool", "wrong-password-123")])
def test_no_login_or_a_wrong_one_is_unauthorized_and_names_the_secret(
    tmp_path: Path, with_auth: Registry, login: Login | None
) -> None:
    registry = with_auth
    plain = frozenset({registry.host}) if registry.plain_http else frozenset()
    source = OciSource(f"oci://{registry.host}/auth:v1", None, login=login, plain_http=plain, ca_file=registry.ca_file)
    with pytest.raises(SourceError, match="unauthorized") as err:
        _download(source, tmp_path / "dl")
    assert not err.value.transient and "spec.credentials.oci.secretName" in str(err.value)
    assert "wrong-password-123" not in str(err.value)


def test_tls_without_the_registry_ca_is_refused_and_says_how_to_fix(tmp_path: Path, token_tls: Registry) -> None:
    source = _source(token_tls, f"oci://{token_tls.host}/auth:v1", ca=False)
    with pytest.raises(SourceError, match=r"TLS failed.*give the registry's CA") as err:
        _download(source, tmp_path / "dl")
    assert not err.value.transient


def test_a_plain_http_registry_not_listed_is_reached_over_https_only(tmp_path: Path, plain: Registry) -> None:
    source = OciSource(f"oci://{plain.host}/team/sql-coder:v1", None)  # plain_http: none listed
    with pytest.raises(SourceError, match=f"list {plain.host} in spec.credentials.oci.plainHTTP"):
        _download(source, tmp_path / "dl")


def test_the_sidecar_reads_its_settings_from_the_rendered_env(plain: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPOOL_OCI_AUTH", json.dumps({"auths": {plain.host: {"username": "u", "password": "p"}}}))
    monkeypatch.setenv("LORAPOOL_OCI_PLAIN_HTTP", f"other:5000, {plain.host}")
    source = OciSource.from_env(f"oci://{plain.host}/x:v1", None)
    assert source.plain_http and source.login == Login("u", "p")
    monkeypatch.setenv("LORAPOOL_OCI_AUTH", "{not json")
    with pytest.raises(SourceError, match=r"\$LORAPOOL_OCI_AUTH \(spec.credentials.oci.secretName\): not JSON"):
        OciSource.from_env(f"oci://{plain.host}/x:v1", None)


def test_a_revision_is_refused_in_favour_of_a_digest() -> None:
    with pytest.raises(SourceError, match="takes no revision; pin a digest in the source"):
        OciSource("oci://registry.example.com/x:v1", "main")


# --- the API server: the CRD's rules for oci:// sources and spec.credentials.oci ----------------


@pytest.mark.cluster
def test_the_api_server_takes_a_digest_pinned_adapter_and_refuses_a_reference_without_tag(
    local_cluster: LocalCluster, example_doc: dict[str, Any]
) -> None:
    """The CEL rules must fit the API server's cost budget (a longer oci:// regex did not) and say the
    rule's words; the example GitOps file and a pool naming a registry Secret are accepted."""
    repo = Path(__file__).resolve().parents[2]
    local_cluster.kubectl("apply", "--server-side", "-f", str(repo / "crds"))

    def established() -> bool:  # right after the apply the CRD may not be found yet: wait for it, bounded
        done = local_cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=10s", "crd/lorapools.lorapool.io", check=False
        )
        return done.returncode == 0

    wait_until("the LoRAPool CRD to be established", established, 60)
    local_cluster.kubectl("create", "namespace", "ml", check=False)
    pool = copy.deepcopy(example_doc)
    pool["metadata"] = {"name": "llama3-8b", "namespace": "ml"}
    pool["spec"]["credentials"] = {"oci": {"secretName": "adapter-registry", "plainHTTP": ["registry.ml.svc:5000"]}}
    pool["spec"]["adapters"] = [{"name": "sql", "source": "oci://10.0.0.7:5000/team/sql-coder:v1", "rank": 8}]
    example = (repo / "examples" / "registry" / "sql-coder.yaml").read_text()
    accepted = local_cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(pool) + "---\n" + example, check=False
    )
    assert accepted.returncode == 0, accepted.stderr
    pool["spec"]["adapters"][0]["source"] = "oci://registry.example.com/team/sql-coder"
    refused = local_cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(pool), check=False
    )
    assert refused.returncode != 0 and OCI.adapter.message in refused.stderr.replace("\n", " "), refused.stderr
    pool["spec"]["adapters"][0]["source"] = "oci://10.0.0.7:5000/team/sql-coder:v1"
    pool["spec"]["credentials"]["oci"]["plainHTTP"] = ["http://registry.ml.svc:5000"]
    refused = local_cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(pool), check=False
    )
    assert refused.returncode != 0 and "must be a registry as oci:// sources name it" in refused.stderr, refused.stderr


def test_a_docker_config_login_is_found_by_registry_as_docker_login_keys_it() -> None:
    auth = base64.b64encode(b"ci:s3cret").decode()
    config = {
        "auths": {
            "https://index.docker.io/v1/": {"auth": auth},
            "registry.example.com:5000": {"username": "u", "password": "p"},
        }
    }
    assert login_for(config, "docker.io") == Login("ci", "s3cret")
    assert login_for(config, "registry.example.com:5000") == Login("u", "p")
    assert login_for(config, "registry.example.com") is None  # another port is another registry
    assert api_host("docker.io") == "registry-1.docker.io" and api_host("10.0.0.7:5000") == "10.0.0.7:5000"
    with pytest.raises(SourceError, match="'auth' is not base64 of user:password") as err:
        login_for({"auths": {"r.io": {"auth": "%%%"}}}, "r.io")
    assert not err.value.transient


def _pool_adapter(source: str, oci: dict[str, Any]) -> tuple[Any, Any]:
    """A pool with ``spec.credentials.oci`` and its one inline adapter at ``source``."""
    from lorapool.api.load import parse_object
    from lorapool.plan.adapters import merge_adapters

    pool = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1", "kind": "LoRAPool", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "baseModel": {"name": "org/tiny", "source": "hf://org/tiny"}, "gpu": {"product": "A100-80GB"},
                "credentials": {"oci": oci}, "adapters": [{"name": "sql", "source": source, "rank": 8}],
            },
        }
    )  # fmt: skip
    return pool, merge_adapters(pool, []).adapters[0]  # type: ignore[arg-type]


async def _operator_read(pool: Any, adapter: Any) -> Any:
    """The operator's read, as controller.app wires it (no cache)."""
    from lorapool.controller.metadata import fetch_adapter_metadata
    from lorapool.sources.config import fetch_adapter_config

    async def fetch(source: str, revision: str | None, *, options: Any) -> dict[str, Any]:
        return await fetch_adapter_config(source, revision=revision, cache=None, options=options)

    return await fetch_adapter_metadata(pool, adapter, fetch, 30)


def test_the_operator_reads_a_registry_the_pool_lists_as_plain_http(tmp_path: Path, plain: Registry) -> None:
    digest = _push(plain, write_peft_adapter(tmp_path / "a", rank=8), f"oci://{plain.host}/team/op:v1")
    source = f"oci://{plain.host}/team/op@{digest}"
    fetched = asyncio.run(_operator_read(*_pool_adapter(source, {"plainHTTP": [plain.host]})))
    assert fetched.unreadable is None and fetched.config["r"] == 8
    unlisted = asyncio.run(_operator_read(*_pool_adapter(source, {})))  # HTTPS only: a plain registry fails
    assert unlisted.config is None and "plainHTTP" in (unlisted.unreadable or "")


def test_the_operator_says_it_reads_without_the_pools_login(tmp_path: Path, basic: Registry) -> None:
    """The operator has no RBAC on Secrets: a registry that needs the login is unreadable to it, and
    the reason says so instead of pointing at settings the pool already has."""
    digest = _push(basic, write_peft_adapter(tmp_path / "a", rank=8), f"oci://{basic.host}/team/op:v1")
    oci = {"plainHTTP": [basic.host], "secretName": "registry-login"}
    fetched = asyncio.run(_operator_read(*_pool_adapter(f"oci://{basic.host}/team/op@{digest}", oci)))
    assert fetched.config is None
    assert "without registry-login (it reads no Secrets), the sidecars log in" in (fetched.unreadable or "")
    assert basic.password is not None and basic.password not in (fetched.unreadable or "")
