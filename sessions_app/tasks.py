"""Celery tasks of sessions_app: ids in, re-fetch, call a service."""

from __future__ import annotations

from celery import shared_task

from sessions_app.search import search_index_pending


@shared_task(acks_late=True, ignore_result=True)
def search_index_session(session_id: str) -> int:
    """Index the session's new events for search (idempotent: only events not yet indexed
    are touched; a deleted session has none)."""
    return search_index_pending(session_id=session_id)
