"""The stale-run sweeper: what frees a session whose compaction lost its worker.

A run shows it is alive through `heartbeat_at`: stamped when it is queued, when a worker
starts it, and every `COMPACTION_STALE_SECONDS / 4` while it works (compaction_app/heartbeat.py).
When that stamp is older than `COMPACTION_STALE_SECONDS`:
- a `running` run lost its worker (killed, out of memory, machine gone). It is failed: nothing
  of it was applied (a run applies in one transaction), its events stay as they were, and
  `COMPACTION_COMPLETE` with `success: false` tells the watchers. Re-running it would repeat
  whatever killed the worker.
- a `pending` run's task never reached a worker (the broker lost it, or the process whose
  in-memory broker held it exited). It is queued again, up to `MAX_REQUEUES` times, and then
  failed.

The sweep runs from Celery beat in production (`compaction_app.tasks.sweep_stale_compactions`),
from a timer thread in the embedded profile (`start_embedded_sweeper`), and by hand from the
admin and `manage.py clear_stale_runs`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery.exceptions import CeleryError
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import KombuError

from compaction_app.enqueue import send_run
from compaction_app.models import ACTIVE_STATUSES, CompactionRun, RunStatus
from compaction_app.realtime import broadcast, messages
from compaction_app.run_documents import run_snapshot
from sessions_app.models import Session
from sessions_app.services import session_record_compaction

logger = logging.getLogger("compaction_app.sweeper")

# A task lost this many times is not a hiccup: the run fails rather than waiting forever.
MAX_REQUEUES = 3


@dataclass
class SweepResult:
    failed: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)


def sweep_stale_runs(
    *,
    stale_seconds: float | None = None,
    now: datetime | None = None,
    session_id: uuid.UUID | str | None = None,
) -> SweepResult:
    """Fail every running run whose heartbeat is older than `stale_seconds` (default
    COMPACTION_STALE_SECONDS) and re-queue (or, after MAX_REQUEUES, fail) every pending run
    queued longer ago. Safe to run concurrently: each change is a conditional update, and a
    run that beat meanwhile is left alone. `session_id` limits the sweep to one session's runs
    (`recover_stale_run`)."""
    stale = float(settings.COMPACTION_STALE_SECONDS if stale_seconds is None else stale_seconds)
    cutoff = (now or timezone.now()) - timedelta(seconds=stale)
    result = SweepResult()
    runs = CompactionRun.objects.filter(status__in=ACTIVE_STATUSES, heartbeat_at__lt=cutoff)
    if session_id is not None:
        runs = runs.filter(session_id=session_id)
    candidates = runs.values_list("pk", "status", "requeues", "heartbeat_at")
    for run_id, status, requeues, heartbeat_at in list(candidates):
        age = int(((now or timezone.now()) - heartbeat_at).total_seconds())
        if status == RunStatus.RUNNING:
            error = (
                f"the worker running this compaction stopped (no heartbeat for {age} s); "
                "nothing was changed"
            )
            if fail_run(run_id=run_id, error=error, statuses=[status], stale_before=cutoff):
                logger.warning("compaction %s failed by the sweeper: %s", run_id, error)
                result.failed.append(str(run_id))
        elif requeues < MAX_REQUEUES:
            if _requeue(run_id=run_id, stale_before=cutoff):
                logger.warning(
                    "compaction %s was queued %s s ago and never started: queued again",
                    run_id,
                    age,
                )
                result.requeued.append(str(run_id))
        else:
            error = (
                f"the compaction's task was lost {requeues + 1} times (never started); "
                "nothing was changed"
            )
            if fail_run(run_id=run_id, error=error, statuses=[status], stale_before=cutoff):
                logger.warning("compaction %s failed by the sweeper: %s", run_id, error)
                result.failed.append(str(run_id))
    return result


def recover_stale_run(*, session_id: uuid.UUID | str) -> bool:
    """Lazy recovery, for a request that found the session's run active: the sweep above, for
    this session only, on the spot. A deployment whose beat (or embedded timer) is down thus
    never has a session blocked by a dead worker's run. True when a run was failed (the
    session is free again); a re-queued run stays active."""
    result = sweep_stale_runs(session_id=session_id)
    return bool(result.failed)


def clear_runs(*, run_ids: Iterable[uuid.UUID | str], cleared_by: str) -> list[str]:
    """Fail the given pending or running runs now, however fresh their heartbeat (an
    operator's decision: the admin action and `clear_stale_runs --run`). Returns the ids that
    were cleared; finished runs are left as they are."""
    cleared = []
    for run_id in run_ids:
        error = f"cleared by hand ({cleared_by}); nothing was changed"
        if fail_run(run_id=run_id, error=error, statuses=list(ACTIVE_STATUSES)):
            logger.warning("compaction %s cleared by hand by %s", run_id, cleared_by)
            cleared.append(str(run_id))
    return cleared


def fail_run(
    *,
    run_id: uuid.UUID | str,
    error: str,
    statuses: list[str],
    stale_before: datetime | None = None,
) -> CompactionRun | None:
    """Fail one run if it is still in one of `statuses` (and, with `stale_before`, still has
    a heartbeat older than that), record it as the session's last compaction and announce it.
    Returns the failed run, or None when it had moved on."""
    session_id = (
        CompactionRun.objects.filter(pk=run_id).values_list("session_id", flat=True).first()
    )
    if session_id is None:
        return None
    with transaction.atomic():
        # Session before run: the order the apply and revert transactions lock them in.
        Session.objects.select_for_update().filter(pk=session_id).first()
        runs = CompactionRun.objects.filter(pk=run_id, status__in=statuses)
        if stale_before is not None:
            runs = runs.filter(heartbeat_at__lt=stale_before)
        if not runs.update(status=RunStatus.FAILED, error=error[:2000], finished_at=timezone.now()):
            return None
        run = CompactionRun.objects.select_related("session").get(pk=run_id)
        session_record_compaction(session_id=session_id, snapshot=run_snapshot(run))
        transaction.on_commit(
            lambda: broadcast.broadcast(
                session_id=run.session_id,
                owner_id=run.session.owner_id,
                message=messages.compaction_complete(run),
            )
        )
    return run


def _requeue(*, run_id: uuid.UUID | str, stale_before: datetime) -> bool:
    # Stamp first (conditionally), so a concurrent sweep does not queue it a second time and
    # the next sweep waits a full window for this task.
    claimed = CompactionRun.objects.filter(
        pk=run_id, status=RunStatus.PENDING, heartbeat_at__lt=stale_before
    ).update(heartbeat_at=timezone.now(), requeues=F("requeues") + 1)
    if not claimed:
        return False
    try:
        send_run(run_id)
    except (CeleryError, KombuError, OSError) as exc:
        # The broker is down: the run stays pending and the next sweep tries again.
        logger.warning("could not re-queue compaction %s: %s", run_id, exc)
        return False
    return True


class EmbeddedSweeper(threading.Thread):
    """The embedded profile's sweeper: a daemon thread inside the server process that sweeps
    every COMPACTION_SWEEP_SECONDS (production uses Celery beat instead)."""

    def __init__(self, *, interval: float | None = None) -> None:
        super().__init__(name="compaction-sweeper", daemon=True)
        self.interval = float(settings.COMPACTION_SWEEP_SECONDS if interval is None else interval)
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            try:
                close_old_connections()
                sweep_stale_runs()
            except Exception:
                logger.exception("stale-run sweep failed")
            finally:
                # Hold no database connection (nor SQLite's file) between sweeps.
                connection.close()
            self._stopped.wait(self.interval)

    def stop(self, *, timeout: float = 10) -> None:
        self._stopped.set()
        self.join(timeout=timeout)


def start_embedded_sweeper(*, interval: float | None = None) -> EmbeddedSweeper:
    """Start the embedded profile's sweeper thread and return it."""
    sweeper = EmbeddedSweeper(interval=interval)
    sweeper.start()
    return sweeper
