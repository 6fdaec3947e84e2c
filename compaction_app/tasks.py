"""Celery tasks: ids in, re-fetch, call a service."""

from __future__ import annotations

import logging
import random

import httpx
from celery import shared_task
from django.conf import settings

from compaction_app.models import CompactionRun
from compaction_app.services import TransientCompactionError, compaction_execute
from compaction_app.sweeper import sweep_stale_runs
from sessions_app.event_documents import event_out
from sessions_app.models import Event

logger = logging.getLogger("compaction_app.tasks")


def retry_countdown(retries: int, *, cap: float) -> float:
    """Exponential backoff with jitter: base × 2^retries, capped, drawn from [half, full].

    The base comes from `COMPACTION_RETRY_BACKOFF_SECONDS` (default 2 s) so tests and
    impatient deployments can shorten it without touching the task definitions."""
    base = float(settings.COMPACTION_RETRY_BACKOFF_SECONDS)
    delay = min(base * (2**retries), cap)
    return random.uniform(delay / 2, delay)  # noqa: S311 - jitter, not cryptography


@shared_task(bind=True, acks_late=True, max_retries=3)
def run_compaction(self, run_id: str) -> str:  # type: ignore[no-untyped-def]
    """Execute one compaction run; safe to deliver twice (a finished run is left alone).
    Transient provider errors are retried; the last attempt fails the run cleanly."""
    final_attempt = self.request.retries >= self.max_retries
    try:
        run = compaction_execute(
            run_id=run_id, final_attempt=final_attempt, attempt=self.request.retries
        )
    except CompactionRun.DoesNotExist:
        # Its session was deleted since (or the message outlived its database): nothing to do.
        logger.warning("compaction %s no longer exists; task dropped", run_id)
        return "missing"
    except TransientCompactionError as exc:
        logger.warning(
            "compaction %s: transient failure (attempt %s), retrying: %s",
            run_id,
            self.request.retries + 1,
            exc,
        )
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries, cap=60)) from exc
    return str(run.status)


@shared_task(bind=True, acks_late=True, max_retries=5)
def memory_flush_webhook(self, run_id: str, event_ids: list[str]) -> int | None:  # type: ignore[no-untyped-def]
    """POST the events a run folds to MEMORY_FLUSH_WEBHOOK_URL (when set), retried on failure."""
    url = settings.MEMORY_FLUSH_WEBHOOK_URL
    if not url:
        return None
    events = list(Event.objects.filter(pk__in=event_ids).order_by("seq"))
    session_id = str(events[0].session_id) if events else None
    payload = {
        "type": "memory_flush",
        "compactionId": run_id,
        "sessionId": session_id,
        "events": event_out(events),
    }
    timeout = float(settings.MEMORY_FLUSH_WEBHOOK_TIMEOUT_SECONDS)
    try:
        response = httpx.post(url, json=payload, timeout=timeout)
        if response.status_code >= 500 or response.status_code == 429:
            raise httpx.HTTPStatusError(
                f"webhook answered {response.status_code}",
                request=response.request,
                response=response,
            )
    except httpx.HTTPError as exc:
        if self.request.retries >= self.max_retries:
            logger.error("memory_flush webhook for run %s gave up: %s", run_id, exc)
            return None
        logger.warning("memory_flush webhook for run %s failed, retrying: %s", run_id, exc)
        raise self.retry(exc=exc, countdown=retry_countdown(self.request.retries, cap=120)) from exc
    if response.status_code >= 400:
        logger.warning("memory_flush webhook refused run %s: %s", run_id, response.status_code)
    return response.status_code


@shared_task(acks_late=True, ignore_result=True)
def sweep_stale_compactions() -> dict[str, list[str]]:
    """Celery beat's periodic sweep: fail or re-queue compaction runs whose worker is gone."""
    result = sweep_stale_runs()
    return {"failed": result.failed, "requeued": result.requeued}


@shared_task(name="compaction_app.ping", acks_late=True)
def ping() -> str:
    """Does nothing. With one queue consumed in order, once it has run every task queued before
    it has too: the test suite waits on it to drain the worker between tests, and an operator
    can send it to see that a worker is consuming."""
    return "pong"
