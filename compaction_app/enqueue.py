"""Queueing compaction work for a worker: the one place a run (or the memory_flush webhook
that reports on it) is sent to Celery.

The producers (compaction_app.services and the sweeper) name the task instead of importing
compaction_app.tasks: the tasks import the services they call, so the dependency runs one
way (tasks → services → enqueue), and a task's name is already the contract between the
process that sends it and the worker that runs it. The app registers the tasks at startup
(CompactionAppConfig.ready), so the lookup finds them in every process, and a task sent
while `task_always_eager` is on still runs inline.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction

from compaction_app.models import CompactionRun, RunStatus
from config.celery import app
from sessions_app.errors import ServiceUnavailable

logger = logging.getLogger("compaction_app.enqueue")

RUN_COMPACTION = "compaction_app.tasks.run_compaction"
MEMORY_FLUSH_WEBHOOK = "compaction_app.tasks.memory_flush_webhook"

# What a client is told to wait before asking again when the broker refused a run.
ENQUEUE_RETRY_AFTER_SECONDS = 10


def _task(name: str) -> Any:
    return app.tasks[name]


def send_run(run_id: uuid.UUID | str) -> None:
    """Send the run's task now. Raises whatever the broker raises (the sweeper, re-queueing,
    keeps the run pending and tries again on its next sweep)."""
    _task(RUN_COMPACTION).delay(str(run_id))


def enqueue_run(run_id: uuid.UUID) -> None:
    """Send a newly requested run's task. If the broker refuses, remove the run and answer
    503: a pending run nobody will execute would block every later compaction of the session
    with a 409, and a failed one would record a compaction that never started."""
    try:
        send_run(run_id)
    except Exception as exc:
        logger.warning("could not queue compaction %s: %s: %s", run_id, type(exc).__name__, exc)
        CompactionRun.objects.filter(pk=run_id, status=RunStatus.PENDING).delete()
        raise ServiceUnavailable(
            "the task queue is unreachable; no compaction was started, try again shortly",
            retryAfter=ENQUEUE_RETRY_AFTER_SECONDS,
        ) from exc


def enqueue_run_on_commit(run_id: uuid.UUID) -> None:
    """Send the run's task once the transaction that created the run commits (a worker must
    find the run when the task reaches it)."""
    transaction.on_commit(lambda: enqueue_run(run_id))


def enqueue_memory_flush(*, run_id: uuid.UUID, event_ids: list[str]) -> None:
    """Queue the memory_flush webhook for the events a run folds, once the run commits. Never
    raises: the flush must not hold up or fail the run it reports on."""
    try:
        _task(MEMORY_FLUSH_WEBHOOK).delay_on_commit(str(run_id), event_ids)
    except Exception:
        logger.exception("could not queue the memory_flush webhook for run %s", run_id)
