"""sessions_app's own signal receivers (connected when SessionsAppConfig.ready imports this
module). They queue the Celery tasks: tasks import the services they call, never the reverse."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db.models.signals import post_migrate
from django.dispatch import receiver

from sessions_app.exact_counts import exact_counting_enabled
from sessions_app.models import EventType, Session
from sessions_app.search_schema import ensure_search_schema
from sessions_app.signals import events_appended
from sessions_app.tasks import count_exact_tokens, search_index_everything_task

logger = logging.getLogger("sessions_app")
# Where the exact count's enqueue failures have always been logged.
_count_logger = logging.getLogger("sessions_app.exact_counts")


# After a broker refused a message, appends stop trying it for a while: indexing is optional
# (search covers unindexed events), and each attempt against a dead broker costs its timeout.
# Kept per broker URL, so a broker that failed does not silence one that works.
BROKER_BACKOFF_SECONDS = 30.0
_broker_failed_at: dict[str, float] = {}

# Appends queue one indexing pass for everything, at most one per INDEX_DELAY_SECONDS per
# process: the first append of a window starts a timer, later ones find it running, and when
# it fires it is cleared first and the pass queued after, so the pass sees every append that
# found the timer running. A pass costs a Celery worker several milliseconds of CPU whatever
# it indexes; one per append was most of what the worker did under a busy gateway. The delay
# is kept here rather than as a Celery countdown: a worker that holds ETA tasks when its Redis
# connection drops can stop consuming (celery/celery#8030, #8091).
INDEX_DELAY_SECONDS = 1.0
_index_timer: threading.Timer | None = None
_index_lock = threading.Lock()


@receiver(events_appended, dispatch_uid="sessions_app.search_index")
def index_appended_events(sender: Any, *, session_id: Any, **kwargs: Any) -> None:
    """Queue the indexing of new events for search (search_schema explains why it is not
    done inside the append); coalesced, see above."""
    queue_index_pass()


def queue_index_pass() -> None:
    """Ask for an indexing pass, coalesced with the others of the window (see above): after
    an append, and when a search found a session whose index is not complete."""
    global _index_timer
    if not INDEX_DELAY_SECONDS:
        _queue_index_pass()
        return
    with _index_lock:
        if _index_timer is not None:
            return  # a pass is coming that will see these events
        _index_timer = threading.Timer(INDEX_DELAY_SECONDS, _fire_index_timer)
        _index_timer.daemon = True
        _index_timer.start()


def _fire_index_timer() -> None:
    global _index_timer
    with _index_lock:
        _index_timer = None  # before queuing: an append from now on starts the next window
    _queue_index_pass()


def _queue_index_pass() -> None:
    """The signal fires after the append committed; a broker outage must not fail or slow it,
    so the message is sent once, without publish retries, and a failure is only logged."""
    broker = str(search_index_everything_task.app.conf.broker_url)
    failed_at = _broker_failed_at.get(broker)
    if failed_at is not None and time.monotonic() - failed_at < BROKER_BACKOFF_SECONDS:
        return
    try:
        search_index_everything_task.apply_async(retry=False)
        _broker_failed_at.pop(broker, None)
    except Exception as exc:
        _broker_failed_at[broker] = time.monotonic()
        logger.warning(
            "could not queue search indexing (search indexes on read meanwhile): %s: %s",
            type(exc).__name__,
            exc,
        )


@receiver(events_appended, dispatch_uid="sessions_app.exact_counts")
def count_appended_exactly(
    sender: Any, *, session: Session, event_types: list[str], **kwargs: Any
) -> None:
    """A Claude session's new events get Anthropic's exact count (see exact_counts)."""
    if exact_counting_enabled(model=session.model) and set(event_types) != {
        EventType.LOCAL_SYSTEM_MESSAGE
    }:
        schedule_exact_count(session_id=session.pk)


def schedule_exact_count(*, session_id: Any) -> None:
    """Enqueue the count after the current transaction commits; a broker outage is logged,
    never raised (the local counts stay and the next append schedules again)."""
    try:
        count_exact_tokens.delay_on_commit(str(session_id))
    except Exception:
        _count_logger.warning(
            "could not enqueue the exact count of session %s", session_id, exc_info=True
        )


@receiver(post_migrate, dispatch_uid="sessions_app.search_schema")
def repair_search_schema(sender: Any, *, app_config: Any, using: str, **kwargs: Any) -> None:
    """Re-create the search index's triggers if a later migration rebuilt the SQLite event
    table (which drops them), and index what was stored meanwhile."""
    if app_config.label != "sessions_app":
        return
    from django.db import connections
    from django.db.migrations.recorder import MigrationRecorder

    target = connections[using]
    applied = MigrationRecorder(target).applied_migrations()
    # Only while the search migration is applied (not after a migrate back before it).
    if any(app == "sessions_app" and name.endswith("_search") for app, name in applied):
        ensure_search_schema(target, backfill=False)
