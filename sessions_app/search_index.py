"""Search index upkeep: bringing the index up to date with the stored events.

The index itself is described in `sessions_app/search_schema.py`. An append queues a Celery task
(`sessions_app.tasks.search_index_everything_task`, coalesced: see receivers.py) that calls
`search_index_everything`; a search first calls `index_scope` for what it is about to query,
so nothing stored is ever missed. Every entry point is idempotent.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, transaction

from sessions_app.models import Event, Session
from sessions_app.search_schema import (
    DOCUMENT_FUNCTION,
    FTS_TABLE,
    MAP_TABLE,
    STATE_TABLE,
    VECTOR_COLUMN,
)

_EVENT_TABLE = Event._meta.db_table
_SESSION_TABLE = Session._meta.db_table


def search_index_pending(*, session_id: Any, batch: int = 500) -> int:
    """Index the session's events the search index lacks; returns how many were indexed.
    Idempotent (the Celery task after an append and a search may both call it).

    SQLite: the events above the session's indexed seq, in one IMMEDIATE transaction (the
    write lock is taken at BEGIN, so two callers never index the same events). PostgreSQL:
    rows without a vector, in batches; rows another transaction holds are skipped and left to
    the next call (search computes their vector meanwhile)."""
    key = uuid.UUID(str(session_id))
    if connection.vendor == "sqlite":
        return _sqlite_index(key)
    if connection.vendor != "postgresql":
        return 0
    return _pg_index("session_id = %s AND", [key], batch=batch, order="ORDER BY seq")


def _pg_index(scope: str, params: list[Any], *, batch: int, order: str = "") -> int:
    """Write the vectors of unindexed rows in `scope` (a WHERE prefix), `batch` rows per
    statement, until none is left; rows another transaction holds are skipped and left to the
    next call (search computes their vector meanwhile). The partial index on unindexed rows
    finds them."""
    sql = (
        f"UPDATE {_EVENT_TABLE} SET {VECTOR_COLUMN} = {DOCUMENT_FUNCTION}(content, name) "  # noqa: S608
        f"WHERE id IN (SELECT id FROM {_EVENT_TABLE} WHERE {scope} "
        f"{VECTOR_COLUMN} IS NULL {order} LIMIT %s FOR UPDATE SKIP LOCKED)"
    )
    done = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, batch])
            count = cursor.rowcount
        done += count
        if count < batch:
            return done


def _sqlite_index(session_id: uuid.UUID) -> int:
    sid = session_id.hex
    # Identifiers come from constants; values are parameters.
    watermark = (
        f"SELECT coalesce((SELECT indexed_seq FROM {STATE_TABLE} WHERE session_id = %s), 0), "  # noqa: S608
        f"coalesce((SELECT last_seq FROM {_SESSION_TABLE} WHERE id = %s), 0), "
        f"(SELECT coalesce(max(id), 0) FROM {MAP_TABLE})"
    )
    with connection.cursor() as cursor:
        # A plain read first: the usual answer is "nothing to do", and it must not queue
        # every search behind the database's single write lock.
        cursor.execute(watermark, [sid, sid])
        indexed, last, _top = cursor.fetchone()
    if last <= indexed:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(watermark, [sid, sid])  # again, under the write lock
        indexed, last, top = cursor.fetchone()
        if last <= indexed:
            return 0
        cursor.execute(
            f"INSERT INTO {MAP_TABLE} (event_id) SELECT id FROM {_EVENT_TABLE} "  # noqa: S608
            "WHERE session_id = %s AND seq > %s ORDER BY seq",
            [sid, indexed],
        )
        count = cursor.rowcount
        cursor.execute(
            f"INSERT INTO {FTS_TABLE} (rowid, sid, body) "  # noqa: S608
            "SELECT m.id, e.session_id, e.content || char(10) || e.name "
            f"FROM {MAP_TABLE} m JOIN {_EVENT_TABLE} e ON e.id = m.event_id WHERE m.id > %s",
            [top],
        )
        cursor.execute(
            f"INSERT INTO {STATE_TABLE} (session_id, indexed_seq) VALUES (%s, %s) "  # noqa: S608
            "ON CONFLICT (session_id) DO UPDATE SET indexed_seq = excluded.indexed_seq",
            [sid, last],
        )
    return count


def index_scope(*, session_id: uuid.UUID | None = None, owner_id: Any | None = None) -> None:
    """Before a search: index what the background task has not reached yet in the scope (one
    session, an owner's sessions, or all), so the query runs on the index. PostgreSQL does it
    for one session only (a cross-session query covers unindexed rows itself), and skips rows
    the task holds at that moment (the query covers those too)."""
    if connection.vendor == "postgresql" and session_id is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {_EVENT_TABLE} WHERE session_id = %s "  # noqa: S608
                f"AND {VECTOR_COLUMN} IS NULL LIMIT 1",
                [session_id],
            )
            stale = cursor.fetchone() is not None
        if stale:
            search_index_pending(session_id=session_id)
        return
    if connection.vendor != "sqlite":
        return
    if session_id is not None:
        _sqlite_index(session_id)
        return
    for pk in _sqlite_pending_sessions(owner_id=owner_id):
        _sqlite_index(pk)


def _sqlite_pending_sessions(*, owner_id: Any | None = None) -> list[uuid.UUID]:
    sql = (
        f"SELECT s.id FROM {_SESSION_TABLE} s LEFT JOIN {STATE_TABLE} st "  # noqa: S608
        "ON st.session_id = s.id WHERE s.last_seq > coalesce(st.indexed_seq, 0)"
    )
    params: list[Any] = []
    if owner_id is not None:
        sql += " AND s.owner_id = %s"
        params.append(owner_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [pk if isinstance(pk, uuid.UUID) else uuid.UUID(pk) for (pk,) in cursor.fetchall()]


def search_index_everything(*, batch: int = 500) -> int:
    """Index every session's events the index lacks; returns how many were indexed. The task
    appends queue (coalesced, see receivers.py): one pass covers all the sessions appended to
    meanwhile. Idempotent, like `search_index_pending`."""
    if connection.vendor == "sqlite":
        return sum(_sqlite_index(pk) for pk in _sqlite_pending_sessions())
    if connection.vendor != "postgresql":
        return 0
    return _pg_index("", [], batch=batch)
