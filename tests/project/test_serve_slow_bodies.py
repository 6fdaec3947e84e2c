"""`manage.py serve` closes connections whose request body trickles in (issue 22, row 15):
daphne reads the whole body before the application runs and never timed that read out."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]
SLOW_CONNECTIONS = 20
BODY_TIMEOUT = 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    env = {
        key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        VAR_DIR=str(tmp_path),
        HTTP_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
        HTTP_IDLE_TIMEOUT_SECONDS="4",
        PYTHONPATH=str(ROOT),
    )
    process = subprocess.Popen(  # noqa: S603 - our own command
        [sys.executable, "manage.py", "serve", "--port", str(port), "--no-demo-user"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "serve exited"
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=20)


def _closed(connection: socket.socket) -> bytes | None:
    """What the server sent before closing, or None while it is still open."""
    connection.setblocking(False)
    try:
        data = connection.recv(4096)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    finally:
        connection.setblocking(True)
    return data


def test_it_closes_connections_whose_body_trickles_in(server):
    port = server
    slow = []
    for _ in range(SLOW_CONNECTIONS):
        connection = socket.create_connection(("127.0.0.1", port), timeout=5)
        connection.sendall(
            b"POST /api/v1/tokens/count HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        )
        slow.append(connection)
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)  # never sends a byte
    started = time.monotonic()
    answers: dict[int, bytes] = {}
    # Deadline + the 2 s check interval + slack for a loaded machine.
    while len(answers) < SLOW_CONNECTIONS and time.monotonic() - started < BODY_TIMEOUT + 12:
        for index, connection in enumerate(slow):
            if index in answers:
                continue
            try:
                connection.sendall(b" ")  # a byte at a time: resets any idle timer
            except OSError:
                answers[index] = b""
                continue
            data = _closed(connection)
            if data is not None:
                answers[index] = data
        time.sleep(0.25)
    assert len(answers) == SLOW_CONNECTIONS, f"{SLOW_CONNECTIONS - len(answers)} still open"
    assert any(b"408" in data for data in answers.values()), answers
    # The server still answers a normal request meanwhile and after.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b"GET /api/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert connection.recv(64).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 12
    while _closed(idle) is None:
        assert time.monotonic() < deadline, "an idle connection stayed open"
        time.sleep(0.25)
    for connection in [*slow, idle]:
        connection.close()
