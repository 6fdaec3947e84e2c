"""The two servers the docs name, as the docs start them: `daphne config.asgi:application` (the
production profile's) and `manage.py serve`. What a red team did to them (issue 42): a provider
key in a URI reached the access log (row 8), half-written request lines held file descriptors
until legitimate calls failed (row 9). Each test starts both, as child processes on this run's
profile (PostgreSQL and Redis when the run has them, else an embedded profile of their own)."""

from __future__ import annotations

import http.client
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.helpers import closed_port, stop_process, wait_listening

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_PRODUCTION = ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "CHANNELS_PREFIX", "EMBEDDED_WORKER")

SERVERS = ["daphne", "serve"]


def _env(var_dir: str, **extra: str) -> dict[str, str]:
    from django.conf import settings

    if settings.DATABASE_URL:
        from tests.support.daphne import production_env

        return production_env(EMBEDDED_WORKER="false", **extra)
    env = {k: v for k, v in os.environ.items() if k not in _PRODUCTION}
    return {**env, "VAR_DIR": var_dir, "EMBEDDED_WORKER": "false", **extra}


def _command(kind: str, port: int) -> list[str]:
    if kind == "daphne":
        # docs/operations.md: `.venv/bin/daphne -b 0.0.0.0 -p 8000 config.asgi:application`
        return [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    return [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)]


@contextmanager
def documented_server(
    kind: str, *, descriptors: int | None = None, **extra: str
) -> Iterator[tuple[int, dict[str, str]]]:
    """The server started as documented; yields (port, written), where `written["log"]` is
    its stdout and stderr once it has stopped."""
    port = closed_port()
    with tempfile.TemporaryDirectory(prefix="documented-server-") as var_dir:
        log = Path(var_dir) / "server.log"

        def limit() -> None:
            if descriptors is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

        with log.open("w") as out:
            server = subprocess.Popen(
                _command(kind, port),
                cwd=ROOT,
                env=_env(var_dir, **extra),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=limit,  # noqa: PLW1509 (no threads of ours run meanwhile)
            )
            written = {"log": ""}
            try:
                wait_listening(port, server, what=kind, seconds=90)
                yield port, written
            finally:
                stop_process(server, seconds=20)
                out.flush()
                written["log"] = log.read_text()


def _raw(port: int, path: str, method: str = "GET") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=b"{}" if method == "POST" else None)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


# --- row 8: no access log keeps a key ---------------------------------------------------------

# Gemini's key in the query, plainly or percent-encoded, on gateway paths and a site page.
KEYED_PATHS = [
    ("GET", "/gateway/gemini/v1beta/models?key=SECRET-AAA"),
    ("POST", "/gateway/gemini/v1beta/models/gemini-2.5-pro:generateContent?alt=sse&key=SECRET-BBB"),
    ("GET", "/gateway/gemini/v1beta/files%3Fkey=SECRET-CCC"),
    ("GET", "/gateway/gemini/v1beta/files%3fKEY%3DSECRET-DDD%26x=1"),
    ("GET", "/gateway/gemini/v1beta/files%3Fpage=2%26key=SECRET-EEE"),
    ("GET", "/no-such-page?key=SECRET-FFF"),
]


def _send_keyed_requests(port: int) -> None:
    for method, path in KEYED_PATHS:
        assert _raw(port, path, method) in (401, 404), path


def _assert_no_key_logged(written: str) -> None:
    """Issue 42, row 8: daphne's access log kept Gemini's `?key=` (26 lines), and `%3F` in a
    passthrough path was decoded into a real `?` (`files%3Fkey=K` logged, and sent, as a key).
    Every line the server writes (access log, Django's request warnings) shows `***`."""
    assert written.count("/gateway/gemini/") >= 5, written[-3000:]  # the access log is there
    assert "SECRET" not in written, [line for line in written.splitlines() if "SECRET" in line]


# --- row 9: half-open connections cannot exhaust file descriptors ----------------------------

DESCRIPTORS = 512
MAX_CONNECTIONS = 200


def _assert_half_written_requests_take_no_descriptors_from_calls(port: int) -> None:
    """Issue 42, row 9: 20,800 half-written request lines without credentials took daphne to
    its 20,000 file descriptors, and legitimate calls failed while they were held. With 512
    descriptors and 700 half-written request lines held open, past HTTP_MAX_CONNECTIONS (at
    most half the descriptors) the longest-waiting connections are closed, and a legitimate
    call is answered at once, every time."""
    held: list[socket.socket] = []
    try:
        for number in range(700):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET /gateway/openai/v1/mod")  # never finished
            held.append(sock)
            if number % 100 == 99:
                started = time.monotonic()
                assert _raw(port, "/gateway/openai/v1/models") == 401, number  # answered
                assert time.monotonic() - started < 5
        # The oldest were closed by the server.
        closed = 0
        for sock in held[:300]:
            sock.settimeout(0.05)
            try:
                closed += sock.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed += 1
        assert closed >= 250, closed
        assert _raw(port, "/gateway/openai/v1/models") == 401
    finally:
        for sock in held:
            sock.close()


def _assert_a_trickled_request_line_is_closed(port: int, idle_seconds: int) -> None:
    """A byte a second resets Twisted's own idle timeout: the wait is counted from the
    connection, whatever arrives (HTTP_IDLE_TIMEOUT_SECONDS)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(1)
    started = time.monotonic()
    ended = False
    try:
        for byte in b"GET /gateway/openai/v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: 1234567890\r\n":
            try:
                sock.sendall(bytes([byte]))
                ended = sock.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:
                ended = True
            if ended:
                break
    finally:
        sock.close()
    assert ended and time.monotonic() - started < idle_seconds + 5


@pytest.mark.parametrize("kind", SERVERS)
def test_a_documented_server_logs_no_key_and_keeps_its_descriptors_for_calls(kind):
    """Rows 8 and 9 of issue 42 on one server start each (a start takes seconds)."""
    idle = 3
    with documented_server(
        kind,
        descriptors=DESCRIPTORS,
        HTTP_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        HTTP_IDLE_TIMEOUT_SECONDS=str(idle),
    ) as (port, output):
        _send_keyed_requests(port)
        _assert_half_written_requests_take_no_descriptors_from_calls(port)
        _assert_a_trickled_request_line_is_closed(port, idle)
    _assert_no_key_logged(output["log"])
