"""Threads of a session (selectors, read only): which writer's conversation is the main one.

The main thread is the one the client named `main` (`X-Ledger-Thread: main`), else the
longest-lived: the most calls, the earliest on a tie. The session's usage is its main
thread's; side calls, sub-agents and workers are listed after it.
"""

from __future__ import annotations

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
