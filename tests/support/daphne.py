"""A daphne process of a test's own, serving config.asgi with the environment the test gives
(its database, channel prefix, limits): for what only a real server shows (HTTP framing, the
production channel layer)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.helpers import closed_port

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def daphne_process(env: Mapping[str, str], *, start_seconds: float = 60) -> Iterator[int]:
    """Start daphne on a free port, wait until it accepts connections, yield the port; stop
    it afterwards (killed if it does not stop within 20 s)."""
    port = closed_port()
    command = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    server = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + start_seconds
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    raise RuntimeError(f"daphne did not start: {server.stderr.read()}") from None
                time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
