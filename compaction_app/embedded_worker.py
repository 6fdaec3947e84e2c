"""The embedded profile's Celery worker: a thread inside the server process, consuming the
in-memory broker that the web requests publish to."""

from __future__ import annotations

import threading

from celery import Celery


def start_embedded_worker(app: Celery, *, loglevel: str = "WARNING") -> threading.Thread:
    """Start a solo-pool worker on a daemon thread and return the thread."""
    app.set_current()
    app.set_default()
    worker = app.WorkController(
        app=app,
        pool_cls="solo",
        concurrency=1,
        loglevel=loglevel,
        hostname=f"embedded@{threading.get_ident()}",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        # The worker runs in a thread, not the main one: signal handlers belong to the server.
        install_signal_handlers=False,
    )
    thread = threading.Thread(target=worker.start, name="celery-embedded-worker", daemon=True)
    thread.start()
    return thread
