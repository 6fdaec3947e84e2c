"""Search index upkeep: bringing the index up to date with the stored events.

The index itself is described in `sessions_app/search_schema.py`. An append queues a Celery task
(`sessions_app.tasks.search_index_everything_task`, coalesced: see receivers.py) that calls
`search_index_everything`. A search first calls `index_scope` for what it is about to query:
PostgreSQL's query covers unindexed rows itself; on SQLite the search indexes at most one
bounded batch (BATCH_CHARS / BATCH_SECONDS: the writer lock is never held longer), answers from
what is indexed and says how far that goes (`IndexState`), and the rest is left to the task.
Every entry point is idempotent.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
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

    SQLite: the events above the session's watermark, in bounded batches (each its own short
    IMMEDIATE transaction that re-checks the watermark, so two callers never index the same
    text). PostgreSQL:
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


# --- SQLite: bounded batches -----------------------------------------------------------------
#
# Tokenizing for FTS5 runs at tens of MB/s, and SQLite has one writer: indexing a 31 MB event
# in one transaction held every other writer (appends of every user) for seconds. So text is
# indexed in pieces of at most CHUNK_CHARS characters (an event longer than that gets several
# FTS rows, overlapping by CHUNK_OVERLAP characters so a phrase across a cut is still found),
# and a batch writes at most BATCH_CHARS characters, or stops after BATCH_SECONDS, in its own
# short IMMEDIATE transaction. The text is read before the write lock is taken (WAL: a read
# never waits for the writer). Progress is the session's watermark: every event up to
# `indexed_seq` is indexed, and the first `indexed_chars` characters of the next one.
CHUNK_CHARS = 256_000
CHUNK_OVERLAP = 2_000
BATCH_CHARS = 512_000
BATCH_SECONDS = 0.05
_BATCH_EVENTS = 200


@dataclass(frozen=True)
class IndexState:
    """How far a session's events are indexed: every event up to `indexed_seq`, and
    `pending` says whether any event above it is still waiting."""

    indexed_seq: int
    last_seq: int

    @property
    def pending(self) -> bool:
        return self.last_seq > self.indexed_seq


_WATERMARK = (
    f"SELECT coalesce((SELECT indexed_seq FROM {STATE_TABLE} WHERE session_id = %s), 0), "  # noqa: S608
    f"coalesce((SELECT indexed_chars FROM {STATE_TABLE} WHERE session_id = %s), 0), "
    f"coalesce((SELECT last_seq FROM {_SESSION_TABLE} WHERE id = %s), 0)"
)


def _sqlite_watermark(cursor: Any, sid: str) -> tuple[int, int, int]:
    cursor.execute(_WATERMARK, [sid, sid, sid])
    indexed, chars, last = cursor.fetchone()
    return int(indexed), int(chars), int(last)


@dataclass(frozen=True)
class _Piece:
    event_id: str
    seq: int
    start: int  # characters of the event's content already indexed before this piece
    end: int  # exclusive; the event is complete once `end` reaches its length
    length: int
    name: str

    @property
    def last(self) -> bool:
        return self.end >= self.length


def _plan(cursor: Any, sid: str, indexed: int, chars: int) -> list[_Piece]:
    """The pieces of the next batch, in order, at most BATCH_CHARS characters together (at
    least one piece). Reads only lengths and names, not the content."""
    cursor.execute(
        f"SELECT id, seq, length(content), name FROM {_EVENT_TABLE} "  # noqa: S608
        "WHERE session_id = %s AND seq > %s ORDER BY seq LIMIT %s",
        [sid, indexed, _BATCH_EVENTS],
    )
    pieces: list[_Piece] = []
    budget = BATCH_CHARS
    start = chars
    for event_id, seq, length, name in cursor.fetchall():
        length = int(length or 0)
        while True:
            end = min(length, start + CHUNK_CHARS)
            size = end - start
            if pieces and size > budget:
                return pieces
            pieces.append(_Piece(str(event_id), int(seq), start, end, length, name or ""))
            budget -= size
            if end >= length:
                break
            start = end
        start = 0
        if budget <= 0:
            break
    return pieces


def _piece_text(cursor: Any, piece: _Piece) -> str:
    """The piece's text: its characters plus the overlap into the next piece; the event's
    name goes with its last piece (one FTS row per small event, as before chunking)."""
    if piece.start == 0 and piece.last:
        cursor.execute(
            f"SELECT content FROM {_EVENT_TABLE} WHERE id = %s",  # noqa: S608
            [piece.event_id],
        )
    else:
        cursor.execute(
            f"SELECT substr(content, %s, %s) FROM {_EVENT_TABLE} WHERE id = %s",  # noqa: S608
            [piece.start + 1, piece.end - piece.start + CHUNK_OVERLAP, piece.event_id],
        )
    row = cursor.fetchone()
    text = str(row[0]) if row and row[0] is not None else ""
    return text + "\n" + piece.name if piece.last else text


def _sqlite_batch(session_id: uuid.UUID) -> tuple[int, bool]:
    """One bounded batch for the session: (events completed, whether any is left)."""
    sid = session_id.hex
    with connection.cursor() as cursor:
        # Plain reads first (no write lock): the usual answer is "nothing to do".
        indexed, chars, last = _sqlite_watermark(cursor, sid)
        if last <= indexed:
            return 0, False
        pieces = _plan(cursor, sid, indexed, chars)
        if not pieces:
            # Gaps above the watermark (deleted events): nothing left to index.
            texts: list[str] = []
        else:
            texts = [_piece_text(cursor, piece) for piece in pieces]
    started = time.monotonic()
    done = 0
    with transaction.atomic(), connection.cursor() as cursor:
        # Under the write lock: another caller may have indexed these meanwhile.
        if _sqlite_watermark(cursor, sid)[:2] != (indexed, chars):
            return 0, True
        new_seq, new_chars = (last, 0) if not pieces else (indexed, chars)
        for piece, text in zip(pieces, texts, strict=True):
            cursor.execute(
                f"INSERT INTO {MAP_TABLE} (event_id) SELECT id FROM {_EVENT_TABLE} "  # noqa: S608
                "WHERE id = %s",
                [piece.event_id],
            )
            if cursor.rowcount:
                cursor.execute(
                    f"INSERT INTO {FTS_TABLE} (rowid, sid, body) "  # noqa: S608
                    "VALUES (last_insert_rowid(), %s, %s)",
                    [sid, text],
                )
            if piece.last:
                new_seq, new_chars = piece.seq, 0
                done += 1
            else:
                new_seq, new_chars = piece.seq - 1, piece.end
                # seq - 1 may not be the previous event's seq; `seq > indexed_seq` still
                # finds this event first, which is all the watermark needs.
            if time.monotonic() - started > BATCH_SECONDS:
                break
        cursor.execute(
            # Not for a session deleted meanwhile (its trigger already removed its state).
            f"INSERT INTO {STATE_TABLE} (session_id, indexed_seq, indexed_chars) "  # noqa: S608
            f"SELECT %s, %s, %s WHERE EXISTS (SELECT 1 FROM {_SESSION_TABLE} WHERE id = %s) "
            "ON CONFLICT (session_id) DO UPDATE SET "
            "indexed_seq = excluded.indexed_seq, indexed_chars = excluded.indexed_chars",
            [sid, new_seq, new_chars, sid],
        )
    return done, new_seq < last


def _sqlite_index(session_id: uuid.UUID, *, batches: int | None = None) -> int:
    """Index the session's events in bounded batches (all of them, or at most `batches`);
    returns how many events were completed."""
    total = 0
    count = 0
    while batches is None or count < batches:
        done, more = _sqlite_batch(session_id)
        total += done
        count += 1
        if not more:
            break
    return total


def sqlite_index_state(*, session_id: uuid.UUID) -> IndexState:
    with connection.cursor() as cursor:
        indexed, _chars, last = _sqlite_watermark(cursor, session_id.hex)
    return IndexState(indexed_seq=indexed, last_seq=last)


def index_scope(
    *, session_id: uuid.UUID | None = None, owner_id: Any | None = None
) -> IndexState | None:
    """Before a search: index some of what the background task has not reached yet in the
    scope (one session, an owner's sessions, or all), so the query runs on the index.

    PostgreSQL does it for one session only (a cross-session query covers unindexed rows
    itself), and skips rows the task holds at that moment (the query covers those too); it
    returns None: nothing is ever pending there. SQLite indexes at most one bounded batch
    (per session searched, or in all for a wider scope) and returns the searched session's
    state (None for a wider scope), so a search never holds the writer lock for long and a
    large event is indexed by the background task while searches answer from what is
    indexed."""
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
        return None
    if connection.vendor != "sqlite":
        return None
    if session_id is not None:
        _sqlite_index(session_id, batches=1)
        return sqlite_index_state(session_id=session_id)
    started = time.monotonic()
    for pk in _sqlite_pending_sessions(owner_id=owner_id):
        _sqlite_index(pk, batches=1)
        if time.monotonic() - started > BATCH_SECONDS:
            break
    return None


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
