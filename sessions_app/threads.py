"""Threads of a session (selectors, read only): which writer's conversation is the main one.

The main thread is the one the client named `main` (`X-Ledger-Thread: main`), else the
longest-lived: the most calls, the earliest on a tie. The session's context figures are its
main thread's (sessions_app.scope); side calls, sub-agents and workers are listed after it.
"""

from __future__ import annotations

from typing import Any

from sessions_app.models import Session, Thread

MAIN_NAME = "main"


def _rank(thread: Thread) -> tuple[int, int, float, int]:
    named_main = 0 if thread.key == MAIN_NAME else 1
    return (named_main, -thread.calls, thread.created_at.timestamp(), thread.pk)


def session_threads(*, session: Session) -> list[Thread]:
    """The session's threads, main first, then by when they started."""
    threads = list(Thread.objects.filter(session=session).order_by("created_at", "id"))
    if not threads:
        return []
    main = min(threads, key=_rank)
    return [main, *[t for t in threads if t.pk != main.pk]]


def main_thread(*, session: Session) -> Thread | None:
    threads = session_threads(session=session)
    return threads[0] if threads else None


def threads_by_session(*, session_ids: list[Any]) -> dict[Any, list[Thread]]:
    """Each session's threads, main first (one query for a page of sessions)."""
    grouped: dict[Any, list[Thread]] = {}
    for thread in Thread.objects.filter(session_id__in=session_ids).order_by("created_at", "id"):
        grouped.setdefault(thread.session_id, []).append(thread)
    for key, threads in grouped.items():
        main = min(threads, key=_rank)
        grouped[key] = [main, *[t for t in threads if t.pk != main.pk]]
    return grouped
