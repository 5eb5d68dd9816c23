"""A real CNCF distribution registry on 127.0.0.1 for the oci:// tests, with the auth and TLS
setups registries are met with: none, htpasswd (Basic), a token service (the Bearer flow Docker
Hub, GHCR and Harbor use) and TLS from a self-signed CA.

The binary is Debian's ``docker-registry`` (apt-get installed on first use when we are root, as
``lorapool_dev.image.build`` installs its tools), else ``registry`` built from the Go module proxy
into ``$LORAPOOL_CACHE/bin``. htpasswd lines are bcrypt (the registry takes nothing else): Python's
``bcrypt`` when installed, else Debian ``apache2-utils``' htpasswd. The token service is ours: a
thread signing RS256 JWTs the registry checks against the certificate in its ``rootcertbundle``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from lorapool.cache import cache_root
from lorapool_dev import apt, gotool
from lorapool_dev.testing.processes import RunningProcess, free_port, free_ports, start_process

REGISTRY_MODULE = "github.com/distribution/distribution/v3/cmd/registry"
REGISTRY_VERSION = "v3.0.0"
SERVICE = "lorapool-test-registry"


class Namespace(Protocol):
    """A network namespace the calling thread can enter (``lorapool_dev.cluster.netns.Netns``)."""

    def entered(self) -> contextlib.AbstractContextManager[None]: ...


@dataclass(frozen=True)
class Registry:
    """A running registry: ``host`` is ``LISTEN_HOST:PORT`` (``127.0.0.1:PORT`` by default) as oci://
    sources name it."""

    host: str
    plain_http: bool
    ca_file: Path | None
    username: str | None
    password: str | None
    root: Path  # the registry's storage: tests tamper with blobs here

    def docker_config(self) -> dict[str, Any]:
        """A docker config document logging in to this registry (what a dockerconfigjson Secret holds)."""
        if self.username is None or self.password is None:
            return {"auths": {}}
        auth = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"auths": {self.host: {"auth": auth}}}

    def push(self, adapter: Path, reference: str, *args: str, preexec: Callable[[], None] | None = None) -> str:
        """``lorapool adapter push ADAPTER REFERENCE --plain-http ARGS`` with this registry's login on stdin,
        as a user's CI runs it; the manifest digest it printed (``sha256:<64 hex>``). ``preexec``: run the
        CLI elsewhere (inside the real node's network namespace)."""
        login = ["--username", self.username, "--password-stdin"] if self.username else []
        argv = [sys.executable, "-m", "lorapool.cli", "adapter", "push", str(adapter), reference, "--plain-http"]
        pushed = subprocess.run(
            [*argv, *args, *login], input=f"{self.password or ''}\n", capture_output=True, text=True,
            timeout=60, check=False, preexec_fn=preexec,
        )  # fmt: skip
        digest = pushed.stdout.strip()
        if pushed.returncode != 0 or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise AssertionError(f"lorapool adapter push exited {pushed.returncode}: {pushed.stderr or pushed.stdout}")
        return digest

    def blob_path(self, digest: str) -> Path:
        hexd = digest.removeprefix("sha256:")
        return self.root / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


def registry_binary() -> Path:
    """The registry binary: on PATH, Debian's package, or built from the module proxy (cached)."""
    for name in ("docker-registry", "registry"):
        if found := shutil.which(name):
            return Path(found)
    cached = cache_root() / "bin" / f"registry-{REGISTRY_VERSION}"
    if cached.is_file():
        return cached
    with contextlib.suppress(RuntimeError, subprocess.CalledProcessError):
        apt.install("docker-registry")
        if found := shutil.which("docker-registry"):
            return Path(found)
    if gotool.go_binary() is None:
        raise RuntimeError("no docker-registry package and no Go toolchain to build the registry: install either")
    with tempfile.TemporaryDirectory(prefix="registry-build-") as tmp:
        env = {**gotool.go_env(), "GOBIN": tmp}
        gotool.run_go(["install", f"{REGISTRY_MODULE}@{REGISTRY_VERSION}"], Path(tmp), env)
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / "registry"), cached)
    return cached


def htpasswd_line(username: str, password: str) -> str:
    """``user:bcrypt-hash``: Python's bcrypt when installed, else apache2-utils' htpasswd."""
    try:
        bcrypt: Any = importlib.import_module("bcrypt")  # optional: not a dependency, no stubs
        return f"{username}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}"
    except ImportError:
        pass
    if shutil.which("htpasswd") is None:
        apt.install("apache2-utils")
    out = subprocess.run(
        ["htpasswd", "-nbB", "-C", "5", username, password], check=True, capture_output=True, text=True
    ).stdout
    return out.strip()


def self_signed(directory: Path, *, name: str = "lorapool-test", ip: str = "127.0.0.1") -> tuple[Path, Path]:
    """A certificate (and its key) for 127.0.0.1, localhost and ``ip`` that is also its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), *(x509.IPAddress(IPv4Address(a)) for a in dict.fromkeys(("127.0.0.1", ip)))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _libtrust_kid(der_public_key: bytes) -> str:
    """The key id the registry looks a token's signing key up by (libtrust: base32 of a sha256, in 4s)."""
    digest = base64.b32encode(hashlib.sha256(der_public_key).digest()[:30]).decode()
    return ":".join(digest[i : i + 4] for i in range(0, len(digest), 4))


class _TokenService:
    """Hands out RS256 tokens granting what a scope asks, to a Basic login matching ours only."""

    def __init__(self, key_path: Path, username: str, password: str) -> None:
        from cryptography.hazmat.primitives import serialization

        self.key: Any = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        spki = self.key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.kid = _libtrust_kid(spki)
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.requests = 0

    def token(self, authorization: str | None, scopes: list[str]) -> str | None:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        self.requests += 1
        if authorization != self.expected:
            return None
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": SERVICE, "sub": "test", "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now}
        claims |= {"jti": os.urandom(8).hex(), "access": access}
        header = {"typ": "JWT", "alg": "RS256", "kid": self.kid}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64url(signature)}"


@contextlib.contextmanager
def _serve_tokens(service: _TokenService, port: int) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            token = service.token(self.headers.get("Authorization"), query.get("scope", []))
            body = json.dumps({"token": token}).encode() if token else b'{"details":"unauthorized"}'
            self.send_response(200 if token else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="registry-tokens", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/token"
    finally:
        server.shutdown()
        server.server_close()


def _config(root: Path, addr: str, debug_port: int, auth: dict[str, Any], tls: dict[str, str] | None) -> str:
    http: dict[str, Any] = {"addr": addr, "debug": {"addr": f"127.0.0.1:{debug_port}"}}
    if tls:
        http["tls"] = tls
    doc = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": http,
        **({"auth": auth} if auth else {}),
    }
    return json.dumps(doc)  # YAML is a superset of JSON


@contextlib.contextmanager
def run_registry(
    workdir: Path,
    *,
    auth: str | None = None,
    tls: bool = False,
    timeout_s: float = 30.0,
    listen_host: str = "127.0.0.1",
    netns: Namespace | None = None,
) -> Iterator[Registry]:
    """A registry until the block ends. ``auth``: None, ``"htpasswd"`` (Basic) or ``"token"`` (Bearer);
    the login is ``lorapool``/a random password. ``tls``: HTTPS with a self-signed certificate.

    ``listen_host``/``netns``: a registry on another address of another network namespace (the real
    node's, whose pods cannot reach this machine's loopback): the ports are chosen, the process
    started (it inherits the namespace of the thread that forks it) and its health read from inside
    ``netns``; its clients must run there too. The token service then listens in ``netns`` as well."""
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        with netns.entered() if netns is not None else contextlib.nullcontext():
            registry = _start(stack, workdir, auth, tls, timeout_s, listen_host)
        yield registry


def _start(
    stack: contextlib.ExitStack, workdir: Path, auth: str | None, tls: bool, timeout_s: float, listen_host: str
) -> Registry:
    """Configure and start the registry (and its token service), each stopped when ``stack`` closes."""
    # The debug and token listeners stay on loopback; the registry's own port must be free on listen_host.
    port, debug_port, token_port = (
        free_ports(3) if listen_host == "127.0.0.1" else (free_port(listen_host), *free_ports(2))
    )
    username, password = ("lorapool", os.urandom(9).hex()) if auth else (None, None)
    cert, key = self_signed(workdir, ip=listen_host) if (tls or auth == "token") else (None, None)
    auth_doc: dict[str, Any] = {}
    if auth == "htpasswd":
        assert username is not None and password is not None
        (workdir / "htpasswd").write_text(htpasswd_line(username, password) + "\n")
        auth_doc = {"htpasswd": {"realm": SERVICE, "path": str(workdir / "htpasswd")}}
    elif auth == "token":
        assert username is not None and password is not None and key is not None
        realm = stack.enter_context(_serve_tokens(_TokenService(key, username, password), token_port))
        auth_doc = {"token": {"realm": realm, "service": SERVICE, "issuer": SERVICE, "rootcertbundle": str(cert)}}
    tls_doc = {"certificate": str(cert), "key": str(key)} if tls else None
    config = workdir / "config.yml"
    config.write_text(_config(workdir, f"{listen_host}:{port}", debug_port, auth_doc, tls_doc))
    proc: RunningProcess = stack.enter_context(
        start_process(
            [str(registry_binary()), "serve", str(config)],
            f"http://127.0.0.1:{debug_port}/debug/health",
            timeout_s,
        )
    )
    del proc
    return Registry(
        host=f"{listen_host}:{port}",
        plain_http=not tls,
        ca_file=cert if tls else None,
        username=username,
        password=password,
        root=workdir / "data",
    )
