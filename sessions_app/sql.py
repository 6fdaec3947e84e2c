"""Every hand-written SQL statement that stands in for an ORM call, and the one way their rows
become model instances. Each is written out for the hot path: the ORM would send the same
statement (or more of them), but compiling it cost as much as running it.

Reading rows: `instances(model, sql, params)` with `columns(model)`
    Replaces `Model.objects.raw()`, which on every query works out which column is which field
    and how each value converts (it reads the cursor's description and matches every name
    against the model's fields). For a Session (40-odd columns) that cost more than the
    statement itself, three times per gateway call. Here a query selects the model's concrete
    columns in their declared order, so that work is done once per connection and reused.

`owned_session(key=..., name=...)`: one SELECT joining session, API token and user
    Replaces `Token.objects.select_related("user").get(key=key)` followed by
    `Session.objects.filter(owner=user, pk=... | client_key=...).first()`: the gateway looks
    up its caller and session on every provider call, and the ORM's compilation of this
    three-table join cost as much as the query.

`update_session_returning(...)`: `UPDATE session SET counter = counter + %s, ... RETURNING *`
    Replaces `Session.objects.filter(pk=..., <bound>__lte=...).update(counter=F("counter") + n,
    ...)` followed by `Session.objects.get(pk=...)`: Django's update() cannot return the row,
    and compiling its eleven F() expressions cost more than the round trip RETURNING saves.
    The UPDATE takes the row lock that serialises appends.

`insert_events(events)`: a multi-row INSERT, COPY (PostgreSQL) or executemany (SQLite)
    Replaces `Event.objects.bulk_create(events)` (no signals are attached to Event): Django
    prepares every value of every field, which was the largest cost of a 3,000-event bulk
    append after tokenizing itself; here only the columns that need it are prepared.

`append_in_one_statement(...)`: `WITH updated AS (UPDATE ... RETURNING), inserted AS
(INSERT ...) SELECT ... FROM updated` (PostgreSQL)
    Replaces the two statements above inside `transaction.atomic()`: outside a transaction it is
    one round trip that commits alone, where BEGIN, UPDATE, INSERT and COMMIT took four. No ORM
    call sends one statement for both.

`rollup_locks(keys)`: `SELECT pg_advisory_xact_lock(...)` per hour of the calls rollup
(PostgreSQL; nothing on SQLite, whose writers take one lock for the whole file)
    No ORM call takes an advisory lock. The rollup's builders and a late call's invalidation
    (sessions_app.call_rollup) take the hours they touch, in ascending order, before reading
    what they store: a row another transaction inserted and has not committed is invisible to
    a DELETE, which would not wait for it, so a marker alone could not make a late call's
    invalidation wait for the transaction storing its window.

`repeatable_read()`: `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ` (PostgreSQL)
    No ORM call sets a transaction's isolation. A /metrics scrape reads the per-series totals,
    the windows' markers and the calls of the windows not stored in one snapshot, so a window
    stored meanwhile is counted once, never twice or not at all (on SQLite, the scrape reads
    again if a window was stored or dropped while it read).

On PostgreSQL a statement carrying a long text (an event's content) binds it on the server
(`cursor_for`); the others keep Django's client-side binding.

Not here: the search statements (`search.py`, `search_index.py`) and the search schema's DDL
(`search_schema.py`) are FTS5 and tsvector queries, which have no ORM call to replace. In every
statement here identifiers come from the models and `quote_name`, values are parameters.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar, cast

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from sessions_app.models import Budget, Event, Session, Thread

M = TypeVar("M", bound=Model)

Converter = Callable[[Any, Any, Any], Any]

# --- reading rows ----------------------------------------------------------------------------

# Per connection wrapper: a backend's converters are its own bound methods.
_converters: weakref.WeakKeyDictionary[
    BaseDatabaseWrapper, dict[type[Model], list[tuple[int, Any, list[Converter]]]]
] = weakref.WeakKeyDictionary()


@lru_cache(maxsize=64)
def _column_list(model: type[Model], vendor: str, alias: str) -> str:
    quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{quote(field.column)}" for field in model._meta.concrete_fields)


def columns(model: type[Model], *, alias: str = "") -> str:
    """The model's concrete columns, quoted, in declared order (optionally `alias.`-prefixed):
    what a query read by `instances` must select."""
    return _column_list(model, connections[DEFAULT_DB_ALIAS].vendor, alias)


def _converters_for(
    connection: BaseDatabaseWrapper, model: type[Model]
) -> list[tuple[int, Any, list[Converter]]]:
    per_model = _converters.setdefault(connection, {})
    found = per_model.get(model)
    if found is None:
        found = []
        table = model._meta.db_table
        for index, field in enumerate(model._meta.concrete_fields):
            column = field.get_col(table)
            chain = [
                *connection.ops.get_db_converters(column),
                *column.get_db_converters(connection),
            ]
            if chain:
                found.append((index, column, chain))
        per_model[model] = found
    return found


def instances(model: type[M], sql: str, params: Sequence[Any], *, extra: int = 0) -> list[M]:
    """Run `sql` (selecting `columns(model)`) and return its rows as `model` instances, as
    loaded from the database (values converted as the ORM converts them). `extra` columns
    selected after the model's are set on each instance as `extra_columns` (a tuple)."""
    connection = connections[DEFAULT_DB_ALIAS]
    with cursor_for(params) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return []
    converters = _converters_for(connection, model)
    names = [field.attname for field in model._meta.concrete_fields]
    found: list[M] = []
    for full in rows:
        row = full[: len(full) - extra] if extra else full
        values = list(row)
        for index, column, chain in converters:
            value = values[index]
            for convert in chain:
                value = convert(value, column, connection)
            values[index] = value
        instance = model.from_db(connection.alias, names, values)
        if extra:
            instance.extra_columns = tuple(full[len(full) - extra :])  # type: ignore[attr-defined]
        found.append(instance)
    return found


# A text parameter longer than this is sent to PostgreSQL bound, not inlined (cursor_for).
BIND_TEXT_CHARS = 1 << 16


def cursor_for(params: Sequence[Any]) -> Any:
    """A cursor of the default connection for a statement with these parameters.

    Django's psycopg cursors bind on the client: psycopg writes each value into the statement
    as a quoted literal, so a 30 MB content was held as its escaped copy and again inside the
    statement's text (2.25x in Python, 4x resident). A statement carrying a long text goes
    through a server-binding cursor instead: the value is sent as a parameter of its own, one
    encoded copy (1x, 2x resident). Only then: the append's small statements keep Django's
    cursor (and the plans PostgreSQL makes for their literal values)."""
    if connection.vendor != "postgresql" or not any(
        isinstance(value, str) and len(value) > BIND_TEXT_CHARS for value in params
    ):
        return connection.cursor()
    # Defined by Django for psycopg 3 only (unknown to the stubs).
    from django.db.backends.postgresql.base import (  # type: ignore[attr-defined]
        ServerBindingCursor,
    )

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = ServerBindingCursor(connection.connection)
    # As connection.cursor() wraps its own: error translation, execute wrappers, debug log.
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


# --- the gateway's caller and session ----------------------------------------------------------


def owned_session(*, key: str, name: str) -> Session | None:
    """The session `name` (its id, or else a client key) of the active user whose API token
    is `key`, in one query; `session.budgeted` says whether a budget applies to its calls
    (its owner's, or its client key's: sessions_app.budgets), so a call without one reads
    no budget."""
    try:
        column, value = "id", Session._meta.pk.get_db_prep_value(uuid.UUID(name), connection)  # type: ignore[union-attr]
    except ValueError:
        column, value = "client_key", name
    found = instances(
        Session, _owned_session_sql(connection.vendor, column), [key, True, value], extra=1
    )
    if not found:
        return None
    session = found[0]
    session.budgeted = bool(session.extra_columns[0])  # type: ignore[attr-defined]
    return session


@lru_cache(maxsize=8)
def _owned_session_sql(vendor: str, column: str) -> str:
    """`owned_session`'s statement, looking the session up by `column` (built once each)."""
    quote = connection.ops.quote_name
    user_model = get_user_model()
    budget = quote(Budget._meta.db_table)
    budgeted = (
        f"EXISTS (SELECT 1 FROM {budget} b WHERE b.{quote('user_id')} = s.{quote('owner_id')} "  # noqa: S608
        f"AND (b.{quote('client_key')} = '' OR b.{quote('client_key')} = s.{quote('client_key')}))"
    )
    return (
        f"SELECT {columns(Session, alias='s')}, {budgeted} "  # noqa: S608
        f"FROM {quote(Session._meta.db_table)} s "
        f"JOIN {quote(Token._meta.db_table)} t ON t.{quote('user_id')} = s.{quote('owner_id')} "
        f"JOIN {quote(user_model._meta.db_table)} u ON u.{quote('id')} = s.{quote('owner_id')} "
        f"WHERE t.{quote('key')} = %s AND u.{quote('is_active')} = %s AND s.{quote(column)} = %s"
    )


def recent_threads(*, session_id: uuid.UUID, limit: int) -> list[Thread]:
    """The session's `limit` most recently updated threads, newest first: what
    `Thread.objects.filter(session=…).order_by("-updated_at")[:limit]` reads. The gateway
    reads them on every call; building that ORM query each time cost more than running it."""
    value = Thread._meta.get_field("session").get_db_prep_value(session_id, connection)
    return instances(Thread, _recent_threads_sql(connection.vendor), [value, limit])


@lru_cache(maxsize=4)
def _recent_threads_sql(vendor: str) -> str:
    quote = connection.ops.quote_name
    session, updated = (
        cast(Field, Thread._meta.get_field(name)).column for name in ("session", "updated_at")
    )
    return (
        f"SELECT {columns(Thread)} FROM {quote(Thread._meta.db_table)} "  # noqa: S608
        f"WHERE {quote(session)} = %s ORDER BY {quote(updated)} DESC LIMIT %s"
    )


# --- the session's counters --------------------------------------------------------------------


def update_session_returning(
    session_id: uuid.UUID,
    *,
    deltas: Mapping[str, int],
    values: Mapping[str, Any],
    at_most: Mapping[str, int] | None = None,
) -> Session | None:
    """Add `deltas` to the session row's counters and set `values` (plain values), where the
    row's columns in `at_most` do not exceed their bounds; return the row as updated, or None
    when no row matched. It sets `updated_at` too."""
    bounds = at_most or {}
    sql = _update_returning_sql(connection.vendor, tuple(deltas), tuple(values), tuple(bounds))
    updated = instances(Session, sql, _update_params(session_id, deltas, values, bounds))
    return updated[0] if updated else None


def _update_params(
    session_id: uuid.UUID,
    deltas: Mapping[str, int],
    values: Mapping[str, Any],
    bounds: Mapping[str, int],
) -> list[Any]:
    """The parameters of `_update_returning_sql`, in its order (`updated_at` is now)."""
    meta = Session._meta
    params: list[Any] = list(deltas.values())
    for name, value in {**values, "updated_at": timezone.now()}.items():
        params.append(cast(Field, meta.get_field(name)).get_db_prep_save(value, connection))
    params.append(meta.pk.get_db_prep_value(session_id, connection))  # type: ignore[union-attr]
    params.extend(bounds.values())
    return params


@lru_cache(maxsize=64)
def _update_returning_sql(
    vendor: str, deltas: tuple[str, ...], values: tuple[str, ...], at_most: tuple[str, ...]
) -> str:
    """The statement for these field names (a handful of combinations; built once each). It
    sets `updated_at` too."""
    meta = Session._meta
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        found = meta.get_field(name)
        assert isinstance(found, Field) and found.column
        return quote(found.column)

    sets = [f"{column(name)} = {column(name)} + %s" for name in deltas]
    sets += [f"{column(name)} = %s" for name in (*values, "updated_at")]
    where = [f"{column('id')} = %s", *(f"{column(name)} <= %s" for name in at_most)]
    return (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} "  # noqa: S608
        f"WHERE {' AND '.join(where)} RETURNING {columns(Session)}"
    )


# --- another row, updated with the append ------------------------------------------------------


@dataclass(frozen=True)
class RowUpdate:
    """A row of another table that an append brings up to date in its own transaction (on
    PostgreSQL in its one statement): `deltas` added to counters (concurrent appends add up),
    `values` set, and `updated_at` set to now when the model has it. The append engine knows
    nothing of the row's meaning (a caller's bookkeeping, such as the gateway's thread)."""

    model: type[Model]
    pk: Any
    deltas: Mapping[str, int] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)


def _row_update_params(update: RowUpdate) -> list[Any]:
    meta = update.model._meta
    params: list[Any] = list(update.deltas.values())
    values = dict(update.values)
    if _has_updated_at(update.model):
        values.setdefault("updated_at", timezone.now())
    for name, value in values.items():
        params.append(cast(Field, meta.get_field(name)).get_db_prep_save(value, connection))
    params.append(meta.pk.get_db_prep_value(update.pk, connection))  # type: ignore[union-attr]
    return params


def _has_updated_at(model: type[Model]) -> bool:
    return any(f.name == "updated_at" for f in model._meta.concrete_fields)


def _row_update_names(update: RowUpdate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    values = tuple(update.values)
    if _has_updated_at(update.model) and "updated_at" not in values:
        values += ("updated_at",)
    return tuple(update.deltas), values


@lru_cache(maxsize=64)
def _row_update_sql(
    vendor: str, model: type[Model], deltas: tuple[str, ...], values: tuple[str, ...]
) -> str:
    meta = model._meta
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        found = meta.get_field(name)
        assert isinstance(found, Field) and found.column
        return quote(found.column)

    sets = [f"{column(name)} = {column(name)} + %s" for name in deltas]
    sets += [f"{column(name)} = %s" for name in values]
    pk = quote(cast(Field, meta.pk).column)
    return f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} WHERE {pk} = %s"  # noqa: S608


def update_row(update: RowUpdate) -> None:
    """Run `update` as a statement of its own (inside the caller's transaction)."""
    sql = _row_update_sql(connection.vendor, update.model, *_row_update_names(update))
    with connection.cursor() as cursor:
        cursor.execute(sql, _row_update_params(update))


# --- inserting events --------------------------------------------------------------------------

# Field types whose Python value needs the backend's adaptation (UUID hex on SQLite, JSON,
# aware datetimes); every other column of Event is a str, int, bool or None as is.
_PREPARED_TYPES = frozenset({"UUIDField", "JSONField", "DateTimeField", "ForeignKey"})

# Up to this many rows go in one INSERT statement (far below SQLite's 32,766 parameters).
_SINGLE_STATEMENT_ROWS = 50


@lru_cache(maxsize=4)
def _event_insert_parts(vendor: str) -> tuple[str, str, str, tuple[bool, ...]]:
    """The INSERT's table, columns and placeholders, and which values need preparing (the
    same for every append on a backend)."""
    quote = connection.ops.quote_name
    fields = Event._meta.concrete_fields
    return (
        quote(Event._meta.db_table),
        ", ".join(quote(field.column) for field in fields),
        ", ".join(["%s"] * len(fields)),
        tuple(field.get_internal_type() in _PREPARED_TYPES for field in fields),
    )


def insert_events(events: list[Event]) -> None:
    """INSERT the new events: a few in one statement; more with executemany on SQLite, one
    COPY on PostgreSQL."""
    table, columns_, placeholders, _ = _event_insert_parts(connection.vendor)
    sql = f"INSERT INTO {table} ({columns_}) VALUES ({placeholders})"  # noqa: S608
    rows = _event_rows(events)
    if len(rows) <= _SINGLE_STATEMENT_ROWS:
        # A few rows (an agent's turn): one multi-row INSERT, one round trip (COPY's
        # protocol takes two).
        values = ", ".join([f"({placeholders})"] * len(rows))
        params = [value for row in rows for value in row]
        statement = f"INSERT INTO {table} ({columns_}) VALUES {values}"  # noqa: S608
        with cursor_for(params) as cursor:
            cursor.execute(statement, params)
        mark_stored(events)
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # COPY streams the rows in one round trip; executemany costs one per batch.
            copy_sql = f"COPY {table} ({columns_}) FROM STDIN"
            # The raw psycopg cursor: wrap its errors so a unique violation is IntegrityError.
            with connection.wrap_database_errors, cursor.cursor.copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            for start in range(0, len(rows), 1000):
                cursor.executemany(sql, rows[start : start + 1000])
    mark_stored(events)


def _event_rows(events: list[Event]) -> list[list[Any]]:
    """Each event's column values as an INSERT takes them, in the model's column order (their
    created_at set to now)."""
    now = timezone.now()
    fields = Event._meta.concrete_fields
    prepared = _event_insert_parts(connection.vendor)[3]
    rows = []
    for event in events:
        event.created_at = now
        row = []
        for model_field, prepare in zip(fields, prepared, strict=True):
            value = getattr(event, model_field.attname)
            row.append(
                model_field.get_db_prep_save(value, connection)
                if prepare and value is not None
                else value
            )
        rows.append(row)
    return rows


def mark_stored(events: list[Event]) -> None:
    """Tell the ORM these instances are rows now (as bulk_create would)."""
    for event in events:
        event._state.adding = False
        event._state.db = connection.alias


# --- counters and events in one statement (PostgreSQL) -----------------------------------------


def append_in_one_statement(
    session_id: uuid.UUID,
    *,
    deltas: Mapping[str, int],
    values: Mapping[str, Any],
    at_most: Mapping[str, int],
    events: list[Event],
    also: RowUpdate | None = None,
) -> Session | None:
    """`update_session_returning`, `insert_events` and `also` (`update_row`) as one
    statement; returns the session
    row as updated, or None when the UPDATE matched no row (then no event is stored either:
    their seq would be NULL, and the statement fails whole with IntegrityError).

    Each event's `seq` is taken relative to the row's new last_seq, which only the statement
    knows (the last event 0, the one before it -1, ...); the caller adds `last_seq` to them
    afterwards. Raises IntegrityError as the INSERT would (a stored id)."""
    rows = _event_rows(events)
    seq_index = _event_seq_index()
    params: list[Any] = _update_params(session_id, deltas, values, at_most)
    for event, row_values in zip(events, rows, strict=True):
        row_values[seq_index] = -event.seq  # the statement subtracts it from last_seq
        params.extend(row_values)
    also_sql = ""
    if also is not None:
        also_sql = _row_update_sql(connection.vendor, also.model, *_row_update_names(also))
        params.extend(_row_update_params(also))
    sql = _append_statement_sql(
        connection.vendor, tuple(deltas), tuple(values), tuple(at_most), len(rows), also_sql
    )
    found = instances(Session, sql, params)
    return found[0] if found else None


@lru_cache(maxsize=1)
def _event_seq_index() -> int:
    return [field.attname for field in Event._meta.concrete_fields].index("seq")


@lru_cache(maxsize=256)
def _append_statement_sql(
    vendor: str,
    deltas: tuple[str, ...],
    values: tuple[str, ...],
    at_most: tuple[str, ...],
    rows: int,
    also: str = "",
) -> str:
    """The one-statement append for these field names and this many events (and `also`, an
    UPDATE of another row, as a CTE of its own: PostgreSQL runs every data-modifying CTE)."""
    quote = connection.ops.quote_name
    table, columns_, _, _ = _event_insert_parts(vendor)
    seq_index = _event_seq_index()
    last_seq = quote(Session._meta.get_field("last_seq").column)  # type: ignore[union-attr]
    placeholders = ["%s"] * len(Event._meta.concrete_fields)
    placeholders[seq_index] = f"(SELECT {last_seq} FROM updated) - %s"  # noqa: S608
    row = f"({', '.join(placeholders)})"
    update = _update_returning_sql(vendor, deltas, values, at_most)
    return (
        f"WITH updated AS ({update}), "  # noqa: S608
        f"inserted AS (INSERT INTO {table} ({columns_}) VALUES {', '.join([row] * rows)}) "
        + (f", also AS ({also}) " if also else "")
        + f"SELECT {columns(Session)} FROM updated"  # noqa: S608
    )


# --- the calls rollup's locks and snapshot ------------------------------------------------------

# pg_advisory_xact_lock's first key: the calls rollup's hours (the second is the hour's number).
ROLLUP_LOCK_SPACE = 0x4C52


def rollup_locks(keys: Sequence[int]) -> None:
    """Take the transaction-scoped advisory locks of these hours, in ascending order (so two
    builders never wait for each other in a cycle); nothing on SQLite."""
    if connection.vendor != "postgresql" or not keys:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(%s, k)) FROM "
            "(SELECT unnest(%s::integer[]) AS k ORDER BY 1) AS ordered",
            [ROLLUP_LOCK_SPACE, sorted(set(keys))],
        )


@contextlib.contextmanager
def repeatable_read() -> Iterator[None]:
    """A transaction whose reads share one snapshot: REPEATABLE READ on PostgreSQL. Nothing on
    SQLite (the embedded profile's transactions are IMMEDIATE: a read in one would hold the
    write lock; its callers check what they read instead), nor inside a transaction already."""
    if connection.in_atomic_block or connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield
