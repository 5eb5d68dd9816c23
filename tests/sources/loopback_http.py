"""A tiny HTTP file server on 127.0.0.1 for source and sidecar tests.

Routes map a URL path to bytes; knobs make it fail (``down_status``), stall
(``delay_s``) or count requests, so tests can prove retries, timeouts and caching.
Shared by tests/sources and tests/sidecar (loaded by path: tests are not a package).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class LoopbackServer:
    def __init__(self) -> None:
        self.routes: dict[str, bytes] = {}
        self.down_status: int | None = None  # answer every request with this status
        self.delay_s = 0.0  # sleep before answering (per request)
        self.hits: Counter[str] = Counter()
        self.queries: list[str] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                with server._lock:
                    server.hits[parts.path] += 1
                    server.queries.append(parts.query)
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                try:
                    if server.delay_s:
                        time.sleep(server.delay_s)
                    if server.down_status is not None:
                        self._send(server.down_status, b"down\n")
                        return
                    body = server.routes.get(parts.path)
                    if body is None:
                        self._send(404, b"not found\n")
                        return
                    self._send(200, body)
                finally:
                    with server._lock:
                        server.active -= 1

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add_file(self, route: str, path: Path) -> str:
        self.routes[route] = path.read_bytes()
        return self.url + route

    def add_dir(self, route: str, directory: Path) -> str:
        for f in directory.iterdir():
            if f.is_file():
                self.routes[f"{route.rstrip('/')}/{f.name}"] = f.read_bytes()
        return self.url + route

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
