"""A minimal Hugging Face Hub on 127.0.0.1: enough API for huggingface_hub downloads.

Serves ``GET /api/models/<repo>/revision/<rev>`` (model_info) and
``HEAD|GET /<repo>/resolve/<rev>/<file>`` with the headers the client reads
(X-Repo-Commit, ETag, Content-Length) and the X-Error-Code values it maps to
RepositoryNotFoundError / RevisionNotFoundError / EntryNotFoundError. A repo may
require a bearer token, to prove HF_TOKEN is sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> path -> bytes
    token: str | None = None  # required bearer token (a private repo)

    def add_commit(self, files: dict[str, bytes], *, ref: str = "main") -> str:
        commit = hashlib.sha1(json.dumps(sorted(files)).encode() + b"".join(files.values())).hexdigest()
        self.commits[commit] = dict(files)
        self.refs[ref] = commit
        return commit


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.hits: Counter[str] = Counter()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def end_headers(self) -> None:
                # One request per connection: a pooled keep-alive connection would hold a server
                # thread open past the test that made it (the leak plugin fails such a test).
                self.send_header("Connection", "close")
                super().end_headers()

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _reply(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self.wfile.write(data)

            def _error(self, status: int, code: str, body: bool) -> None:
                self._reply(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code}, body)

            def _serve(self, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.hits[path] += 1
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                    repo_id, rev = f"{parts[2]}/{parts[3]}", "/".join(parts[5:])
                    self._info(repo_id, rev, body)
                elif len(parts) >= 5 and parts[2] == "resolve":
                    repo_id, rev, file = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
                    self._resolve(repo_id, rev, file, body)
                else:
                    self._error(404, "RepoNotFound", body)

            def _repo(self, repo_id: str, body: bool) -> Repo | None:
                repo = hub.repos.get(repo_id)
                if repo is None or (repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}"):
                    self._error(401 if repo else 404, "RepoNotFound", body)
                    return None
                return repo

            def _commit(self, repo: Repo, rev: str, body: bool) -> str | None:
                commit = repo.refs.get(rev, rev if rev in repo.commits else None)
                if commit is None:
                    self._error(404, "RevisionNotFound", body)
                return commit

            def _info(self, repo_id: str, rev: str, body: bool) -> None:
                if (repo := self._repo(repo_id, body)) is None or (commit := self._commit(repo, rev, body)) is None:
                    return
                info = {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": commit,
                    "private": bool(repo.token),
                    "siblings": [{"rfilename": name} for name in sorted(repo.commits[commit])],
                }
                self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)

            def _resolve(self, repo_id: str, rev: str, file: str, body: bool) -> None:
                if (repo := self._repo(repo_id, body)) is None or (commit := self._commit(repo, rev, body)) is None:
                    return
                data = repo.commits[commit].get(file)
                if data is None:
                    self._error(404, "EntryNotFound", body)
                    return
                etag = f'"{hashlib.sha256(data).hexdigest()}"'
                self._reply(200, data, {"X-Repo-Commit": commit, "ETag": etag}, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
