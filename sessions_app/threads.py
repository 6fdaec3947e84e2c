"""Threads of a session (selectors, read only): which writer's conversation is the main one.

The main thread is the one the client named `main` (`X-Ledger-Thread: main`), else the
longest-lived: the most calls, the earliest on a tie. The session's usage is its main
thread's; side calls, sub-agents and workers are listed after it.
"""

from __future__ import annotations

from typing import Any

from sessions_app.errors import NotFound
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


def thread_usage(*, session: Session, usage: dict[str, Any], key: str | None) -> dict[str, Any]:
    """`/usage` for one thread: the session's usage document with the thread's own context
    (what its last call forwarded) and provider totals. `key` None: the main thread's, when
    the session has several writers (one thread, or none: the session's own figures)."""
    threads = session_threads(session=session)
    if key is None:
        if not threads:
            return usage  # no gateway threads: the design's document as it is
        if len(threads) < 2:
            return {**usage, "thread": threads[0].key}
        thread = threads[0]
    else:
        found = next((t for t in threads if t.key == key), None)
        if found is None:
            raise NotFound("thread not found")
        thread = found
    level = session.window_level(thread.context_tokens)
    return {
        **usage,
        "thread": thread.key,
        "contextTokens": thread.context_tokens,
        "percentUsed": level.percent_used,
        "nearLimit": level.near_limit,
        "atLimit": level.at_limit,
        "totalPromptTokens": thread.prompt_tokens,
        "totalCompletionTokens": thread.completion_tokens,
        "totalTokens": thread.prompt_tokens + thread.completion_tokens,
    }
