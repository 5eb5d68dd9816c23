"""Turn EndpointSlices into backend URLs. Pure.

Reads ``discovery.k8s.io/v1`` EndpointSlice objects as plain (camelCase) dicts, keeps ready
endpoints only (a missing ``ready`` condition means ready, as the API documents) and picks
the port by name (else the only port, else the one named ``http``, else the first), and names
the Pod behind each URL (``targetRef``) so the router can find that pod's sidecar report.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def _port(slice_: Mapping[str, Any], port_name: str | None) -> int | None:
    ports = [p for p in slice_.get("ports") or () if isinstance(p, Mapping) and p.get("port")]
    if not ports:
        return None
    if port_name:
        named = [p for p in ports if p.get("name") == port_name]
        return int(named[0]["port"]) if named else None
    if len(ports) == 1:
        return int(ports[0]["port"])
    http = [p for p in ports if p.get("name") == "http"]
    return int((http or ports)[0]["port"])


def _host(address: str, address_type: str) -> str:
    return f"[{address}]" if address_type == "IPv6" or ":" in address else address


def _ready_endpoints(
    slices: Iterable[Mapping[str, Any]], port_name: str | None, scheme: str
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(URL, endpoint) of each ready endpoint."""
    for slice_ in slices:
        port = _port(slice_, port_name)
        if port is None:
            continue
        address_type = str(slice_.get("addressType") or "IPv4")
        for endpoint in slice_.get("endpoints") or ():
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False:
                continue
            for address in (endpoint.get("addresses") or ())[:1]:  # all addresses are one pod
                yield f"{scheme}://{_host(str(address), address_type)}:{port}", endpoint


def backend_urls(
    slices: Iterable[Mapping[str, Any]], *, port_name: str | None = None, scheme: str = "http"
) -> list[str]:
    """Sorted, de-duplicated URLs of the ready endpoints in ``slices``."""
    return sorted({url for url, _ in _ready_endpoints(slices, port_name, scheme)})


def backend_targets(
    slices: Iterable[Mapping[str, Any]], *, port_name: str | None = None, scheme: str = "http"
) -> dict[str, str]:
    """URL -> name of the Pod behind it, for ready endpoints whose ``targetRef`` is a Pod."""
    targets: dict[str, str] = {}
    for url, endpoint in _ready_endpoints(slices, port_name, scheme):
        ref = endpoint.get("targetRef") or {}
        if ref.get("kind") == "Pod" and ref.get("name"):
            targets[url] = str(ref["name"])
    return targets
