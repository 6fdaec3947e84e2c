"""Celery tasks of sessions_app: ids in, re-fetch, call a service."""

from __future__ import annotations

import logging
import random

from celery import shared_task
from django.conf import settings

from sessions_app.exact_counts import CountError, count_session_exactly
from sessions_app.models import Session
from sessions_app.search_index import search_index_everything, search_index_pending

logger = logging.getLogger("sessions_app.tasks")


@shared_task(bind=True, acks_late=True, max_retries=None, name="sessions_app.count_exact_tokens")
def count_exact_tokens(self, session_id: str) -> str:  # type: ignore[no-untyped-def]
    """Replace a Claude session's local counts by Anthropic's. Rate limits and outages are
    retried (`retry-after` when the API gives one, else exponential backoff with jitter) up to
    LEDGER_ANTHROPIC_COUNT_MAX_RETRIES times; then the local counts stay, with one warning."""
    try:
        changed = count_session_exactly(session_id=session_id)
    except Session.DoesNotExist:
        return "missing"
    except CountError as exc:
        attempts = self.request.retries
        if exc.transient and attempts < settings.LEDGER_ANTHROPIC_COUNT_MAX_RETRIES:
            if exc.retry_after is not None:
                countdown = exc.retry_after
            else:
                base = float(settings.LEDGER_ANTHROPIC_COUNT_BACKOFF_SECONDS)
                delay = min(base * (2**attempts), 60.0)
                countdown = random.uniform(delay / 2, delay)  # noqa: S311 - jitter
            logger.info("exact count of %s: %s; retry in %.1fs", session_id, exc, countdown)
            raise self.retry(exc=exc, countdown=countdown) from exc
        logger.warning(
            "exact count of session %s gave up after %s attempt(s), local counts kept: %s",
            session_id,
            attempts + 1,
            exc,
        )
        return "gave_up"
    return f"counted {changed}"


@shared_task(acks_late=True, ignore_result=True, name="sessions_app.search_index_session")
def search_index_session(session_id: str) -> int:
    """Index the session's new events for search (idempotent: only events not yet indexed
    are touched; a deleted session has none)."""
    return search_index_pending(session_id=session_id)


@shared_task(acks_late=True, ignore_result=True, name="sessions_app.search_index_everything")
def search_index_everything_task() -> int:
    """Index every session's unindexed events (queued, coalesced, after appends)."""
    return search_index_everything()


@shared_task(bind=True, acks_late=True, max_retries=5, name="sessions_app.budget_webhook")
def budget_webhook(self, payload: dict) -> int | None:  # type: ignore[no-untyped-def]
    """POST a budget's threshold alert (80 % or 100 % of its limit) to BUDGET_WEBHOOK_URL,
    retried with backoff when the receiver fails."""
    import httpx

    url = settings.BUDGET_WEBHOOK_URL
    if not url:
        return None
    try:
        response = httpx.post(
            url, json=payload, timeout=float(settings.BUDGET_WEBHOOK_TIMEOUT_SECONDS)
        )
        if response.status_code >= 500 or response.status_code == 429:
            raise httpx.HTTPStatusError(
                f"webhook answered {response.status_code}",
                request=response.request,
                response=response,
            )
    except httpx.HTTPError as exc:
        if self.request.retries >= self.max_retries:
            logger.error("budget webhook gave up: %s", exc)
            return None
        countdown = min(2 ** (self.request.retries + 1), 120)
        raise self.retry(exc=exc, countdown=countdown) from exc
    return response.status_code
