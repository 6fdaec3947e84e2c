"""Celery tasks: ids in, re-fetch, call a service."""

from __future__ import annotations

import logging

import httpx
from celery import shared_task
from django.conf import settings

from compaction_app.services import TransientCompactionError, compaction_execute

logger = logging.getLogger("compaction_app.tasks")


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(TransientCompactionError,),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=3,
)
def run_compaction(self, run_id: str) -> str:  # type: ignore[no-untyped-def]
    """Execute one compaction run; safe to deliver twice (a finished run is left alone)."""
    from compaction_app.models import CompactionRun

    try:
        run = compaction_execute(run_id=run_id, final_attempt=self.request.retries >= self.max_retries)
    except CompactionRun.DoesNotExist:
        # The session (and its runs) was deleted before the task ran: nothing to do.
        logger.info("compaction %s no longer exists", run_id)
        return "missing"
    return str(run.status)


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(httpx.HTTPError,),
    retry_backoff=2,
    retry_backoff_max=120,
    max_retries=5,
)
def memory_flush_webhook(self, run_id: str, event_ids: list[str]) -> int | None:  # type: ignore[no-untyped-def]
    """POST the events a run folds to MEMORY_FLUSH_WEBHOOK_URL (when set), retried on failure."""
    url = settings.MEMORY_FLUSH_WEBHOOK_URL
    if not url:
        return None
    from sessions_app.api.serializers import EventOutSerializer
    from sessions_app.models import Event

    events = list(Event.objects.filter(pk__in=event_ids).order_by("seq"))
    session_id = str(events[0].session_id) if events else None
    payload = {
        "type": "memory_flush",
        "compactionId": run_id,
        "sessionId": session_id,
        "events": EventOutSerializer(events, many=True).data,
    }
    response = httpx.post(url, json=payload, timeout=settings.SUMMARIZER_TIMEOUT_SECONDS)
    if response.status_code >= 500 or response.status_code == 429:
        raise httpx.HTTPStatusError(
            f"webhook answered {response.status_code}", request=response.request, response=response
        )
    if response.status_code >= 400:
        logger.warning("memory_flush webhook refused run %s: %s", run_id, response.status_code)
    return response.status_code
