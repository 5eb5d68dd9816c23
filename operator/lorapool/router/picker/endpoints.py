"""Backend URLs as a gateway names them: ``ip:port``, and back. Shell (resolves host names once).

Envoy's ORIGINAL_DST cluster connects to the IP literal it is given, so a ``--backend`` named by
host name (``http://localhost:8001``) is resolved, once, to the address it had when first picked.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def endpoint(url: str, resolve: bool = True) -> str:
    """``ip:port`` (``[ip6]:port``) of a backend base URL; a host name is resolved when ``resolve``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if not resolve:
            raise ValueError(f"backend {url!r}: {host!r} is not an IP literal") from None
        ip = ipaddress.ip_address(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


class Endpoints:
    """Each backend's ``ip:port``, computed once per backend URL."""

    def __init__(self) -> None:
        self._of: dict[str, str] = {}

    def of(self, backend: str) -> str:
        found = self._of.get(backend)
        if found is None:
            found = self._of[backend] = endpoint(backend)
        return found
