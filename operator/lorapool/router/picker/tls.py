"""The picker's serving certificate: the mounted Secret's, else a self-signed one made at start.

Shell (reads files). GIE gateways reach their endpoint picker over TLS without verifying it by
default, so a picker with no ``--ext-proc-tls-cert`` still serves TLS, on an ECDSA P-256 key and
certificate made in memory (valid for a year, names ``localhost``, the host name and 127.0.0.1);
a gateway that verifies is given the Secret's CA and the picker the Secret's pair.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SELF_SIGNED_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class ServingPair:
    cert_pem: bytes
    key_pem: bytes


def load_pair(cert: str | None, key: str | None) -> ServingPair:
    """The pair from ``--ext-proc-tls-cert``/``--ext-proc-tls-key`` (both or neither), else a self-signed one."""
    if (cert is None) != (key is None):
        raise ValueError(
            "--ext-proc-tls-cert and --ext-proc-tls-key go together (a kubernetes.io/tls Secret's tls.crt and tls.key)"
        )
    if cert is None or key is None:
        return self_signed()
    try:
        return ServingPair(Path(cert).read_bytes(), Path(key).read_bytes())
    except OSError as exc:
        raise ValueError(
            f"--ext-proc-tls-cert/--ext-proc-tls-key: cannot read {exc.filename}: {exc.strerror}"
        ) from None


def self_signed(names: tuple[str, ...] = ()) -> ServingPair:
    """A fresh self-signed serving certificate for ``localhost``, this host and ``names``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lorapool-picker")])
    dns = sorted({"localhost", socket.gethostname(), *names})
    alt = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + SELF_SIGNED_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ServingPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)
