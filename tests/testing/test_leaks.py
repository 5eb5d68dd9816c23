"""The leak plugin fails a test that leaves a thread running and a session that leaves a process
or a listening port behind (each run in its own pytest subprocess)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]
ARGS = ("-p", "lorapool_dev.testing.leaks", "-p", "no:cacheprovider", "-q")


def test_a_thread_that_outlives_its_test_is_a_teardown_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import threading, time
        stop = threading.Event()
        def test_leaves_a_thread():
            threading.Thread(target=stop.wait, args=(30,), name="stray-client", daemon=True).start()
        def test_joins_its_thread():
            t = threading.Thread(target=time.sleep, args=(0.1,))
            t.start()
        """
    )
    result = pytester.runpytest_subprocess(*ARGS)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_leaves_a_thread left threads running*stray-client*"])


def test_a_process_left_running_fails_the_session_and_is_killed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import subprocess, sys
        def test_starts_a_server_and_forgets_it():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        """
    )
    result = pytester.runpytest_subprocess(*ARGS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*LEAKS*", "*process *time.sleep(120)*"])


def test_an_in_process_server_left_listening_fails_the_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import socket
        held = []
        def test_listens():
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            held.append(sock)
        """
    )
    result = pytester.runpytest_subprocess(*ARGS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*pytest itself still listens on 127.0.0.1:*"])


def test_a_tidy_session_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import subprocess, sys, threading
        def test_tidy():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()
        """
    )
    pytester.runpytest_subprocess(*ARGS).assert_outcomes(passed=1)
