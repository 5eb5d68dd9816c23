"""The start_process helper the process tests (sim, sidecar, router) stand on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lorapool_dev.testing.processes import ProcessError, free_port, start_process


def test_a_process_that_dies_early_reports_its_output() -> None:
    cmd = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    with pytest.raises(ProcessError, match=r"exited with code 3[\s\S]*boom: bad flag"):
        start_process(cmd, f"http://127.0.0.1:{free_port()}/health", timeout=20)


def test_a_process_that_never_gets_healthy_is_stopped() -> None:
    cmd = [sys.executable, "-c", "import time; print('still starting', flush=True); time.sleep(60)"]
    # Long enough for the interpreter to start and print on a busy machine: its output is the point.
    with pytest.raises(ProcessError, match=r"did not answer 200 within 5 s[\s\S]*still starting"):
        start_process(cmd, f"http://127.0.0.1:{free_port()}/health", timeout=5)


def test_a_healthy_process_is_returned_and_stopped(tmp_path: Path) -> None:
    port = free_port()
    server = (
        "import http.server as h; h.ThreadingHTTPServer(('127.0.0.1', %d), h.SimpleHTTPRequestHandler).serve_forever()"
    )
    with start_process(
        [sys.executable, "-c", server % port], f"http://127.0.0.1:{port}/", timeout=20, cwd=tmp_path
    ) as proc:
        assert proc.popen.poll() is None
    assert proc.popen.poll() is not None
    assert not proc.log_path.exists()
