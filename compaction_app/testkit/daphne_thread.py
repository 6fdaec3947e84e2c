"""daphne serving the app in a thread of the calling process, as `manage.py serve` does (the
server, a Celery worker thread and the in-memory channel layer in one process): for the live
tests and the MCP benchmark. Twisted's reactor starts once per process, so call this once."""

from __future__ import annotations

import threading
import time


def serve_in_thread(*, seconds: float = 30) -> tuple[threading.Thread, str]:
    """Start daphne on a free local port in a daemon thread; that thread and the server's
    base URL once it listens (RuntimeError if it does not within `seconds`)."""
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    from config.asgi import application

    server = Server(
        application=application,
        endpoints=build_endpoint_description_strings(host="127.0.0.1", port=0),
        signal_handlers=False,
        verbosity=0,
    )
    thread = threading.Thread(target=server.run, name="daphne", daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds
    while not server.listening_addresses:
        if time.monotonic() > deadline:
            raise RuntimeError("daphne did not start listening")
        time.sleep(0.05)
    host, port = server.listening_addresses[0]
    return thread, f"http://{host}:{port}"
