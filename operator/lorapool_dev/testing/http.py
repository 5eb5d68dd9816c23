"""Raw HTTP for tests and the playground: a status and the exact bytes, no client in between.

Tests compare what our servers and vLLM answer byte for byte (status codes, error bodies,
content types), which a client library would hide or turn into exceptions. A 4xx or 5xx is a
``Response`` like any other; only a connection failure raises (OSError).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Response:
    status: int
    text: str
    content_type: str

    def json(self) -> Any:
        return json.loads(self.text)


def request(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    content_type: str = "application/json",
    timeout_s: float = 30.0,
) -> Response:
    """``body`` bytes are sent as they are, anything else as JSON."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return Response(resp.status, resp.read().decode(errors="replace"), resp.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read().decode(errors="replace"), err.headers.get("Content-Type", ""))
