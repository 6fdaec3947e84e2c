"""The full-text index of events, per database vendor (raw SQL: neither index is a Django field).

Indexing is never part of an append: tokenizing for the index costs about as much as counting
tokens (FTS5: ~0.13 s for the 3.4 MB bench session; PostgreSQL's to_tsvector: ~0.5 s), which
would push a large bulk append well past its budget. After an append commits, a Celery task
(`sessions_app.tasks.search_index_session`) indexes the new events; a search indexes or covers
whatever that task has not reached yet, so **a search never misses an event**.

SQLite (embedded profile): an FTS5 table. FTS5 needs an integer rowid that never changes,
which the event table (UUID primary key) does not have, so `sessions_app_event_search` maps
each event id to its FTS rowid; `..._search_state` holds, per session, the highest seq indexed
(seqs only grow). A search first indexes the rest of its scope (`seq > indexed_seq`; usually
nothing) in one short write transaction, at most search_index.BATCH_CHARS characters; a
larger backlog is left to the task, which indexes it in such batches, and the search says
indexing is still under way. Triggers remove the entries of deleted events.

PostgreSQL (production profile): a `search_vector tsvector` column with a GIN index. A row
whose vector the task has not written yet is NULL; search computes the vector on the fly for
those rows only (a partial index finds them).

Both sides split text the same way: on every character that is not a letter or a digit,
underscores included, so `ERR_RATE_LIMITED` indexes as `err rate limited` and is found as that
phrase, and `src/billing/models.py` is found by `models.py` or `billing`. Case is folded;
accents are kept (PostgreSQL's `simple` configuration has no accent folding, and FTS5 is set to
match it).
"""

# Every statement here is DDL built from the constants below; nothing comes from input.
# ruff: noqa: S608

from __future__ import annotations

from typing import Any

EVENT_TABLE = "sessions_app_event"
FTS_TABLE = "sessions_app_event_fts"
MAP_TABLE = "sessions_app_event_search"
STATE_TABLE = "sessions_app_event_search_state"
SESSION_TABLE = "sessions_app_session"
VECTOR_COLUMN = "search_vector"
DOCUMENT_FUNCTION = "ledger_search_document"
# PostgreSQL refuses a tsvector over 1 MB; 250,000 characters of the shortest distinct words
# stay well under it. FTS5 has no such limit and indexes everything.
PG_MAX_INDEXED_CHARS = 250_000

SQLITE_CREATE = [
    # One row per indexed piece: an event longer than search_index.CHUNK_CHARS has several.
    f"CREATE TABLE IF NOT EXISTS {MAP_TABLE} (id INTEGER PRIMARY KEY, event_id char(32) NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS {MAP_TABLE}_event ON {MAP_TABLE} (event_id)",
    f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5("
    "sid, body, tokenize = 'unicode61 remove_diacritics 0')",
    # Per session, the highest seq indexed: seqs only grow, so what is left to index is
    # `seq > indexed_seq`, found through the (session, seq) unique index; `indexed_chars`
    # is how much of the next event is indexed already (a large one takes several batches).
    f"CREATE TABLE IF NOT EXISTS {STATE_TABLE} ("
    "session_id char(32) NOT NULL PRIMARY KEY, indexed_seq integer NOT NULL, "
    "indexed_chars integer NOT NULL DEFAULT 0)",
    f"CREATE TRIGGER IF NOT EXISTS {FTS_TABLE}_delete AFTER DELETE ON {EVENT_TABLE} BEGIN "
    f"DELETE FROM {FTS_TABLE} WHERE rowid IN "
    f"(SELECT id FROM {MAP_TABLE} WHERE event_id = old.id); "
    f"DELETE FROM {MAP_TABLE} WHERE event_id = old.id; END",
    f"CREATE TRIGGER IF NOT EXISTS {STATE_TABLE}_delete AFTER DELETE ON {SESSION_TABLE} BEGIN "
    f"DELETE FROM {STATE_TABLE} WHERE session_id = old.id; END",
]
SQLITE_DROP = [
    f"DROP TRIGGER IF EXISTS {FTS_TABLE}_delete",
    f"DROP TRIGGER IF EXISTS {STATE_TABLE}_delete",
    f"DROP TABLE IF EXISTS {FTS_TABLE}",
    f"DROP TABLE IF EXISTS {MAP_TABLE}",
    f"DROP TABLE IF EXISTS {STATE_TABLE}",
]

# The ASCII punctuation ranges, written out so the split does not depend on the locale.
_PG_PUNCTUATION = "[!-/:-@[-`{-~]+"
PG_CREATE = [
    f"CREATE OR REPLACE FUNCTION {DOCUMENT_FUNCTION}(content text, name text) "
    "RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ "
    "SELECT to_tsvector('simple'::regconfig, regexp_replace("
    f"left(content, {PG_MAX_INDEXED_CHARS}) || ' ' || name, '{_PG_PUNCTUATION}', ' ', 'g')) $$",
    f"ALTER TABLE {EVENT_TABLE} ADD COLUMN IF NOT EXISTS {VECTOR_COLUMN} tsvector NULL",
    f"CREATE INDEX IF NOT EXISTS event_search_gin ON {EVENT_TABLE} USING gin ({VECTOR_COLUMN})",
    f"CREATE INDEX IF NOT EXISTS event_search_pending ON {EVENT_TABLE} (session_id) "
    f"WHERE {VECTOR_COLUMN} IS NULL",
]
PG_BACKFILL = [
    f"UPDATE {EVENT_TABLE} SET {VECTOR_COLUMN} = {DOCUMENT_FUNCTION}(content, name) "
    f"WHERE {VECTOR_COLUMN} IS NULL",
]
PG_DROP = [
    "DROP INDEX IF EXISTS event_search_pending",
    "DROP INDEX IF EXISTS event_search_gin",
    f"ALTER TABLE {EVENT_TABLE} DROP COLUMN IF EXISTS {VECTOR_COLUMN}",
    f"DROP FUNCTION IF EXISTS {DOCUMENT_FUNCTION}(text, text)",
]


def ensure_search_schema(connection: Any, *, backfill: bool = True) -> None:
    """Create the vendor's search index where missing; with `backfill`, PostgreSQL also writes
    the vectors of existing events. Idempotent: the migration calls it, and so does every
    `post_migrate` (a later migration that rebuilds the SQLite event table drops its triggers
    with it)."""
    if connection.vendor == "sqlite":
        statements = SQLITE_CREATE  # SQLite indexes lazily (search_index.search_index_pending)
    elif connection.vendor == "postgresql":
        if not backfill and _postgres_complete(connection):
            return  # ALTER TABLE would take an exclusive lock for nothing
        statements = PG_CREATE + (PG_BACKFILL if backfill else [])
    else:
        return
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def _postgres_complete(connection: Any) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT to_regprocedure('{DOCUMENT_FUNCTION}(text, text)') IS NOT NULL "
            "AND to_regclass('event_search_gin') IS NOT NULL "
            "AND to_regclass('event_search_pending') IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM information_schema.columns "
            f"WHERE table_name = '{EVENT_TABLE}' AND column_name = '{VECTOR_COLUMN}')"
        )
        return bool(cursor.fetchone()[0])


def drop_search_schema(connection: Any) -> None:
    statements = {"sqlite": SQLITE_DROP, "postgresql": PG_DROP}.get(connection.vendor, [])
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
