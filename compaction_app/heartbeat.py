"""The heartbeat of a running compaction: a timer thread that stamps the run's `heartbeat_at`
while the worker summarizes. A worker that dies (kill -9, OOM, a lost machine) stops beating,
and the sweeper (compaction_app/sweeper.py) then fails the run so the session is not blocked."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection
from django.utils import timezone

from compaction_app.models import CompactionRun, RunStatus

logger = logging.getLogger("compaction_app.heartbeat")


def beat_interval() -> float:
    """Seconds between beats: a quarter of the stale window, so a few missed beats (a slow
    database, a busy machine) never look like a dead worker."""
    return max(float(settings.COMPACTION_STALE_SECONDS) / 4, 0.05)


def beat(run_id: uuid.UUID | str) -> bool:
    """Stamp the run as alive now. Only a running run beats: a beat never revives a run the
    sweeper already failed. Returns whether the run was still running."""
    return bool(
        CompactionRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
            heartbeat_at=timezone.now()
        )
    )


@contextmanager
def beating(run_id: uuid.UUID | str) -> Iterator[None]:
    """Beat on a background thread for as long as the block runs, and once more when it
    raises (the run may be left running, waiting for a retry)."""
    stop = threading.Event()
    interval = beat_interval()

    def loop() -> None:
        try:
            while not stop.wait(interval):
                try:
                    beat(run_id)
                except Exception:
                    # A missed beat is not fatal; several in a row make the run look stale.
                    logger.warning("heartbeat of compaction %s failed", run_id, exc_info=True)
        finally:
            # Connections are per thread: this one would otherwise stay open until exit.
            connection.close()

    thread = threading.Thread(target=loop, name=f"heartbeat-{run_id}", daemon=True)
    thread.start()
    raised = False
    try:
        yield
    except BaseException:
        raised = True
        raise
    finally:
        stop.set()
        # A beat stuck on a lock must not hold up the run's caller; once it gets through it
        # changes nothing (the run is no longer running) and the thread ends.
        thread.join(timeout=5)
        if raised:
            # The run may now wait for a retry: its countdown starts from a fresh beat.
            try:
                beat(run_id)
            except Exception:
                logger.warning("heartbeat of compaction %s failed", run_id, exc_info=True)
