"""A real Redis on 127.0.0.1 for the routers' shared books (issue 43): Debian's ``redis-server``
(apt-get installed on first use when we are root, as the registry is), memory only, bounded, and
with ``noeviction`` as the rendered store runs: a full store refuses writes loudly instead of
dropping a router's live books.

``RedisStore`` can be killed and started again on the same port (a store lost mid-run), and made
unreachable for one client only by pointing that client at a ``Gate`` (a TCP relay the test closes:
a partition where only some routers lose the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lorapool_dev import apt
from lorapool_dev.testing.processes import free_port

PACKAGE = "redis-server"


def redis_server() -> str:
    """The ``redis-server`` binary, installed from Debian when missing (we are root on CI)."""
    found = shutil.which("redis-server")
    if found is None:
        apt.install(PACKAGE)
        found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not on PATH after apt-get install redis-server")
    return found


@dataclass
class RedisStore:
    """One ``redis-server`` on 127.0.0.1:``port``; ``user``/``password``: an ACL user besides the default."""

    port: int = field(default_factory=free_port)
    user: str | None = None
    password: str | None = None
    maxmemory: str = "64mb"
    _proc: subprocess.Popen[bytes] | None = None
    _dir: Path | None = None

    @property
    def url(self) -> str:
        """``redis://[user:password@]127.0.0.1:PORT/0`` as ``--shared-state`` takes it."""
        auth = f"{self.user}:{self.password}@" if self.user else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 15.0) -> RedisStore:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="lorapool-redis-"))
        argv = [
            redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction", "--dir", str(self._dir),
            "--protected-mode", "yes", "--loglevel", "warning",
        ]  # fmt: skip
        if self.user:
            argv += ["--user", self.user, "on", f">{self.password}", "~lorapool:*", "&lorapool:*", "+@all"]
            argv += ["--user", "default", "off"]
        log = open(self._dir / "redis.log", "ab")  # noqa: SIM115 - the process owns it until stop
        self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start: {self.log()[-2000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        path = (self._dir or Path("/nonexistent")) / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _answers(self) -> bool:
        """A PING answered (with or without auth: NOAUTH is an answer too)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return bool(s.recv(64))
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: the store is gone mid-run (nothing flushed, every connection reset)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None

    def stop(self) -> None:
        self.kill()

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RedisStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class Gate:
    """A TCP relay 127.0.0.1:``port`` -> ``target_port`` in a thread; ``close()`` cuts every
    connection through it and refuses new ones until ``open()`` (a partition for its clients only)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._open = threading.Event()
        self._open.set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redis-gate", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open.is_set():
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        with contextlib.suppress(asyncio.CancelledError):  # shutdown: the relay ends quietly
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def close(self) -> None:
        """Cut: reset every relayed connection and refuse new ones."""
        self._open.clear()

        def cut() -> None:
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(cut)

    def open(self) -> None:
        self._open.set()

    def shutdown(self) -> None:
        self.close()

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


@contextlib.contextmanager
def running_store(**kwargs: object) -> Iterator[RedisStore]:
    """A started ``RedisStore`` (``kwargs`` as its fields), closed at the end."""
    store = RedisStore(**kwargs)  # type: ignore[arg-type]
    with store:
        yield store
