"""Services: every write to sessions and events goes through here.

Appends lock the session row, so `seq` is gap-free and the counters on the session always
equal the sums over its stored events. Token counting happens before the lock is taken: it
is the expensive part and needs no database.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, cast

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.db.models import Field
from django.utils import timezone

from sessions_app import pricing, raw_rows, tokens
from sessions_app.errors import Conflict, InvalidInput, Unprocessable
from sessions_app.model_registry import ModelRegistry
from sessions_app.models import ROLE_FOR_TYPE, Event, EventType, Session, is_model_visible
from sessions_app.session_settings import validate_settings
from sessions_app.signals import announce_appended

MAX_CONTEXT_LIMIT = 100_000_000
# Provider-reported usage: one value, and a session's running sum of each kind. Both stay far
# below PostgreSQL's bigint, and one huge report cannot fill a session's totals on its own.
MAX_REPORTED_TOKENS = 10**12
MAX_REPORTED_TOTAL = 10**15
COMPACT_COMMAND = "/compact"


@lru_cache(maxsize=1)
def _registry_cached(overrides_json: str) -> ModelRegistry:
    return ModelRegistry(overrides=json.loads(overrides_json))


def model_registry() -> ModelRegistry:
    """The registry with the overrides currently in settings (cached per overrides value)."""
    return _registry_cached(json.dumps(django_settings.MODEL_CONTEXT_OVERRIDES, sort_keys=True))


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    # Parts of prompt_tokens the provider read from its cache and wrote to it (of which at
    # the one-hour rate; kept for pricing, not stored as a column).
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None


@dataclass(frozen=True)
class EventInput:
    """A validated event as the API or the import command hands it to `event_append`."""

    type: str
    content: Any
    id: uuid.UUID | None = None
    name: str = ""
    tool_call_id: str = ""
    token_usage: TokenUsage | None = None
    pinned: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # The gateway's hash of the client message the event came from.
    message_hash: str = ""
    # On a gateway reply: what fitting kept from being sent on the call it answers (the
    # client's request minus what was forwarded, in tokens); see sessions_app.pricing.
    saved_tokens: int = 0


@dataclass(frozen=True)
class AppendResult:
    events: list[Event]
    created: int
    # The session row as the append left it (counters included).
    session: Session | None = None


def check_text(value: str, where: str) -> None:
    if "\x00" in value:
        raise InvalidInput(
            "NUL bytes are not allowed",
            code="invalid_content",
            fields={where: "contains a NUL byte"},
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "text must be valid Unicode",
            code="invalid_content",
            fields={where: "contains a lone surrogate"},
        ) from None


def _check_json_text(value: Any, where: str) -> None:
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_json_text(str(key), where)
            _check_json_text(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_json_text(item, where)


def session_create(
    *,
    owner: AbstractBaseUser,
    model: str,
    title: str = "",
    context_limit: int | None = None,
    system_prompt: str | None = None,
    settings: Mapping[str, Any] | None = None,
    client_key: str | None = None,
) -> Session:
    """Create a session; an unknown model needs an explicit `context_limit`. `client_key` is
    the agent's own thread id (the gateway's `X-Ledger-Session`), unique per owner."""
    model = model.strip()
    if not model:
        raise InvalidInput(
            "model is required", code="invalid_model", fields={"model": "must not be empty"}
        )
    check_text(model, "model")
    if system_prompt:
        check_text(system_prompt, "systemPrompt")
    info = model_registry().lookup(model)
    if context_limit is None:
        if info is None:
            raise InvalidInput(
                f"unknown model {model!r}: pass contextLimit to use it",
                code="unknown_model",
                fields={"model": "unknown model; give contextLimit"},
            )
        context_limit = info.context_limit
    _check_context_limit(context_limit)
    check_text(title, "title")
    resolved = validate_settings(settings or {})
    encoding = tokens.resolve_encoding(model).encoding
    with transaction.atomic():
        session = Session.objects.create(
            owner=owner,  # type: ignore[misc]  # any AUTH_USER_MODEL
            title=title,
            model=model,
            encoding=encoding,
            context_limit=context_limit,
            settings=resolved,
            client_key=client_key,
        )
        if system_prompt:
            event_append(
                session=session,
                events=[EventInput(type=EventType.SYSTEM_PROMPT, content=system_prompt)],
            )
            session.refresh_from_db()
    return session


def _check_context_limit(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONTEXT_LIMIT:
        raise InvalidInput(
            "contextLimit must be a positive integer",
            code="invalid_context_limit",
            fields={"contextLimit": f"must be an integer between 1 and {MAX_CONTEXT_LIMIT}"},
        )


def session_update(
    *,
    session: Session,
    title: str | None = None,
    context_limit: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Session:
    """Change a session's title, window or settings. The model (and so the encoding every
    stored count was made with) is fixed at creation."""
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        fields = ["updated_at"]
        if title is not None:
            check_text(title, "title")
            locked.title = title
            fields.append("title")
        if context_limit is not None:
            _check_context_limit(context_limit)
            locked.context_limit = context_limit
            fields.append("context_limit")
        if settings is not None:
            locked.settings = validate_settings(settings, base=locked.settings)
            fields.append("settings")
        locked.save(update_fields=fields)
    return locked


def session_delete(*, session: Session) -> None:
    session.delete()


def _content_for_storage(content: Any, where: str) -> tuple[str, bool]:
    if isinstance(content, str):
        check_text(content, where)
        return content, False
    _check_json_text(content, where)
    return json.dumps(content, ensure_ascii=False, separators=(",", ":")), True


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


def _insert_events(events: list[Event]) -> None:
    """INSERT the new events: a few in one statement; more with executemany on SQLite, one
    COPY on PostgreSQL.

    Equivalent to bulk_create for this model (no signals are attached to Event), but prepares
    only the columns that need it: Django's per-field preparation of every value was the
    largest cost of a 3,000-event bulk append after tokenizing itself.
    """
    table, columns, placeholders, _ = _event_insert_parts(connection.vendor)
    # Identifiers come from the model and quote_name, values are parameters.
    sql = f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"  # noqa: S608
    rows = _event_rows(events)
    with connection.cursor() as cursor:
        if len(rows) <= _SINGLE_STATEMENT_ROWS:
            # A few rows (an agent's turn): one multi-row INSERT, one round trip (COPY's
            # protocol takes two).
            values = ", ".join([f"({placeholders})"] * len(rows))
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values}",  # noqa: S608
                [value for row in rows for value in row],
            )
        elif connection.vendor == "postgresql":
            # COPY streams the rows in one round trip; executemany costs one per batch.
            copy_sql = f"COPY {table} ({columns}) FROM STDIN"
            # The raw psycopg cursor: wrap its errors so a unique violation is IntegrityError.
            with connection.wrap_database_errors, cursor.cursor.copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            for start in range(0, len(rows), 1000):
                cursor.executemany(sql, rows[start : start + 1000])
    _mark_stored(events)


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


def _mark_stored(events: list[Event]) -> None:
    for event in events:
        event._state.adding = False
        event._state.db = connection.alias


def _check_token_usage(usage: TokenUsage | None, index: int) -> TokenUsage | None:
    """Bound provider-reported usage (the API's serializer does the same for its callers);
    a usage with no value at all is no usage."""
    if usage is None:
        return None
    values = {
        "promptTokens": usage.prompt_tokens,
        "completionTokens": usage.completion_tokens,
        "totalTokens": usage.total_tokens,
        "cachedInputTokens": usage.cached_input_tokens,
        "cacheWriteTokens": usage.cache_write_tokens,
        "cacheWrite1hTokens": usage.cache_write_1h_tokens,
    }
    for key, value in values.items():
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 <= value <= MAX_REPORTED_TOKENS
        ):
            raise InvalidInput(
                f"tokenUsage.{key} must be an integer between 0 and {MAX_REPORTED_TOKENS}",
                code="invalid_request",
                fields={
                    f"[{index}].tokenUsage.{key}": f"must be between 0 and {MAX_REPORTED_TOKENS}"
                },
            )
    if all(value is None for value in values.values()):
        return None
    parts = (usage.cached_input_tokens or 0) + (usage.cache_write_tokens or 0)
    if (usage.prompt_tokens is not None and parts > usage.prompt_tokens) or (
        (usage.cache_write_1h_tokens or 0) > (usage.cache_write_tokens or 0)
    ):
        raise InvalidInput(
            "tokenUsage.cachedInputTokens and cacheWriteTokens are parts of promptTokens: "
            "together they cannot exceed it",
            code="invalid_request",
            fields={f"[{index}].tokenUsage.cachedInputTokens": "exceeds promptTokens"},
        )
    return usage


def _same_event(stored: Event, item: EventInput, text: str, is_json: bool) -> bool:
    """Whether a retry's body matches the stored event: type, content, name, toolCallId,
    tokenUsage and metadata. `pinned` is left out: it may have been changed since by PATCH."""
    usage = item.token_usage
    return (
        stored.type == item.type
        and stored.content == text
        and stored.content_is_json == is_json
        and stored.name == item.name
        and stored.tool_call_id == item.tool_call_id
        and stored.prompt_tokens == (usage.prompt_tokens if usage else None)
        and stored.completion_tokens == (usage.completion_tokens if usage else None)
        and stored.total_tokens == (usage.total_tokens if usage else None)
        and stored.cached_input_tokens == (usage.cached_input_tokens if usage else None)
        and stored.cache_write_tokens == (usage.cache_write_tokens if usage else None)
        # Through JSON text: Python's == would take true for 1 and 1.0 for 1.
        and _canonical_json(stored.metadata) == _canonical_json(item.metadata)
    )


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _idempotency_conflict() -> Conflict:
    # One wording whether the id is this session's with another body or someone else's:
    # the answer must not reveal that another user's event exists.
    return Conflict(
        "this event id is already used by a different event; resend the identical event or "
        "use a new id",
        code="idempotency_conflict",
        fields={"id": "already used by a different event"},
    )


def _stored_replays(
    session: Session,
    prepared: Sequence[tuple[EventInput, str, bool]],
    ids: set[uuid.UUID],
) -> dict[uuid.UUID, Event]:
    """The stored events these client-supplied ids name, each checked to be an identical
    retry (else `idempotency_conflict`)."""
    if not ids:
        return {}
    stored = {event.id: event for event in Event.objects.filter(id__in=ids)}
    if not stored:
        return stored
    for item, text, is_json in prepared:
        if item.id is None or item.id not in stored:
            continue
        event = stored[item.id]
        if event.session_id != session.pk or not _same_event(event, item, text, is_json):
            raise _idempotency_conflict()
    return stored


class _TakeCarefulPath(Exception):
    """The direct append could not decide alone (a stored id, the reported totals' bound, no
    such session): nothing was written, and the append is redone the careful way."""


def event_append(
    *,
    session: Session,
    events: Sequence[EventInput],
    session_updates: Mapping[str, Any] | None = None,
) -> AppendResult:
    """Append one or more events atomically.

    An event whose client-supplied id is already stored is returned as stored when the body is
    the same (a retry changes nothing); a different body, or an id stored in another session,
    is a 409 `idempotency_conflict`. Either every new event is stored or none is.

    `session_updates` (field name to plain value) are set on the session row in the same
    UPDATE as the counters, when something new is stored: the gateway's per-session
    bookkeeping rides along without a statement of its own.
    """
    if not events:
        raise InvalidInput(
            "no events given", code="empty_request", fields={"events": "must not be empty"}
        )
    seen: set[uuid.UUID] = set()
    prepared: list[tuple[EventInput, str, bool]] = []
    for index, item in enumerate(events):
        if item.id is not None:
            if item.id in seen:
                raise InvalidInput(
                    "duplicate event id in request",
                    code="duplicate_id",
                    fields={f"[{index}].id": "repeated in this request"},
                )
            seen.add(item.id)
        text, is_json = _content_for_storage(item.content, f"[{index}].content")
        check_text(item.name, f"[{index}].name")
        check_text(item.tool_call_id, f"[{index}].toolCallId")
        # Metadata is stored as JSON too; PostgreSQL's jsonb refuses NUL and lone surrogates.
        _check_json_text(dict(item.metadata), f"[{index}].metadata")
        usage = _check_token_usage(item.token_usage, index)
        if usage is not item.token_usage:
            item = replace(item, token_usage=usage)
        prepared.append((item, text, is_json))

    counter = tokens.counter_for_model(session.model)
    counts: dict[int, int] = {}

    def count(indexes: list[int]) -> None:
        missing = [i for i in indexes if i not in counts]
        costs = tokens.messages_batch_tokens(
            counter,
            [
                (ROLE_FOR_TYPE[prepared[i][0].type], prepared[i][0].content, prepared[i][0].name)
                for i in missing
            ],
        )
        counts.update(zip(missing, costs, strict=True))

    updates = dict(session_updates or {})
    if not seen or len(prepared) <= OPTIMISTIC_MAX_EVENTS:
        # The direct way: one UPDATE ... RETURNING takes the row lock, moves the counters and
        # hands back the row, then the events are inserted. Most ids a client sends are new
        # (a first attempt; the gateway's ids derived from the conversation), so they are
        # not looked up first: a stored id fails the insert, which rolls back, and the
        # careful way below decides. The only cost of guessing wrong is counting a retry's
        # tokens once.
        count(list(range(len(prepared))))
        try:
            return _append_direct(session, prepared, counts, updates, has_ids=bool(seen))
        except _TakeCarefulPath:
            pass

    # Stored events never change their body, so replays found now need no token count; ids
    # stored by a concurrent writer meanwhile are caught again under the lock below.
    replayed = _stored_replays(session, prepared, seen)
    count([index for index, entry in enumerate(prepared) if entry[0].id not in replayed])
    return _append_careful(session, prepared, counts, replayed, updates, seen)


# Above this many events a batch with ids (an import, a client's bulk retry) is more likely
# to hold stored ones, and counting them all up front would cost more than a look-up.
OPTIMISTIC_MAX_EVENTS = 64


@dataclass
class _Added:
    """What the new events add to the session's counters."""

    count: int = 0
    active: int = 0
    active_tokens: int = 0
    ledger: int = 0
    cumulative: int = 0
    prompt: int = 0
    completion: int = 0
    total: int = 0
    reported: int = 0
    # The bill: the session's model prices an event whose metadata names no other.
    model: str = ""
    cached: int = 0
    cache_write: int = 0
    cost_nano: int = 0
    saved: int = 0
    saved_nano: int = 0
    unpriced: int = 0
    unpriced_model: str = ""

    def add(self, item: EventInput, text: str, tokens_: int) -> None:
        self.count += 1
        self.ledger += tokens_
        if is_model_visible(item.type, text):
            self.active += 1
            self.active_tokens += tokens_
        # Synthetic turns (a refresh, a summary) do not count toward the next refresh.
        if item.type not in (EventType.CONTEXT_REFRESH, EventType.COMPACTION):
            self.cumulative += tokens_
        usage = item.token_usage
        if usage is not None:
            self.reported += 1
            self.prompt += usage.prompt_tokens or 0
            self.completion += usage.completion_tokens or 0
            self.total += usage.total_tokens or 0
            self._bill(item, usage)

    def _bill(self, item: EventInput, usage: TokenUsage) -> None:
        """Price the provider call this usage reports, and what fitting saved on it."""
        named = item.metadata.get("model")
        model = named if isinstance(named, str) and named else self.model
        self.cached += usage.cached_input_tokens or 0
        self.cache_write += usage.cache_write_tokens or 0
        price = pricing.price_call(
            model,
            pricing.CallUsage(
                input_tokens=usage.prompt_tokens or 0,
                output_tokens=usage.completion_tokens or 0,
                cached_input_tokens=usage.cached_input_tokens or 0,
                cache_write_tokens=usage.cache_write_tokens or 0,
                cache_write_1h_tokens=usage.cache_write_1h_tokens or 0,
            ),
        )
        saved = max(item.saved_tokens, 0)
        self.saved += saved
        if price.nano_usd is None:
            self.unpriced += 1
            self.unpriced_model = model[:200]
            return
        self.cost_nano += price.nano_usd
        if saved:
            self.saved_nano += pricing.price_input(model, saved).nano_usd or 0

    def deltas(self) -> dict[str, int]:
        return {
            "last_seq": self.count,
            "event_count": self.count,
            "active_event_count": self.active,
            "active_tokens": self.active_tokens,
            "ledger_tokens": self.ledger,
            "cumulative_tokens": self.cumulative,
            "reported_prompt_tokens": self.prompt,
            "reported_completion_tokens": self.completion,
            "reported_total_tokens": self.total,
            "reported_event_count": self.reported,
            "reported_cached_input_tokens": self.cached,
            "reported_cache_write_tokens": self.cache_write,
            "cost_nano_usd": self.cost_nano,
            "saved_tokens": self.saved,
            "saved_nano_usd": self.saved_nano,
            "unpriced_calls": self.unpriced,
        }

    def values(self) -> dict[str, Any]:
        """Plain values to set with the counters: the last model without a price."""
        return {"unpriced_model": self.unpriced_model} if self.unpriced else {}


def _update_returning(
    session_id: uuid.UUID,
    *,
    deltas: Mapping[str, int],
    values: Mapping[str, Any],
    at_most: Mapping[str, int] | None = None,
) -> Session | None:
    """Add `deltas` to the session row's counters and set `values` (plain values), where the
    row's columns in `at_most` do not exceed their bounds; return the row as updated, or None
    when no row matched. One statement: the UPDATE takes the row lock that serialises
    appends, and RETURNING saves reading the row again. Written out rather than built by
    the ORM: compiling eleven F() expressions cost more than the round trip it saves."""
    bounds = at_most or {}
    sql = _update_returning_sql(connection.vendor, tuple(deltas), tuple(values), tuple(bounds))
    updated = raw_rows.instances(Session, sql, _update_params(session_id, deltas, values, bounds))
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
    # Identifiers come from the model and quote_name, values are parameters.
    return (
        f"UPDATE {quote(meta.db_table)} SET {', '.join(sets)} "  # noqa: S608
        f"WHERE {' AND '.join(where)} RETURNING {raw_rows.columns(Session)}"
    )


def _store(
    row: Session,
    prepared: list[tuple[EventInput, str, bool]],
    counts: Mapping[int, int],
    existing: Mapping[uuid.UUID, Event],
) -> AppendResult:
    """Insert the events not in `existing`, their seqs ending at the row's new last_seq (the
    counters' UPDATE already moved it), and announce them once the transaction commits."""
    result, to_create = _new_events(prepared, counts, existing, session=row, last_seq=row.last_seq)
    _insert_events(to_create)
    return _stored(row, result, to_create)


def _new_events(
    prepared: list[tuple[EventInput, str, bool]],
    counts: Mapping[int, int],
    existing: Mapping[uuid.UUID, Event],
    *,
    session: Session,
    last_seq: int,
) -> tuple[list[Event], list[Event]]:
    """The append's events in request order (stored ones from `existing`), and the new ones,
    numbered so that the last ends at `last_seq`."""
    fresh = [
        index
        for index, (item, _, _) in enumerate(prepared)
        if item.id is None or item.id not in existing
    ]
    seq = last_seq - len(fresh)
    to_create: list[Event] = []
    result: list[Event] = []
    for index, (item, text, is_json) in enumerate(prepared):
        if item.id is not None and item.id in existing:
            result.append(existing[item.id])
            continue
        seq += 1
        usage = item.token_usage
        event = Event(
            id=item.id or uuid.uuid4(),
            session=session,
            seq=seq,
            type=item.type,
            content=text,
            content_is_json=is_json,
            name=item.name,
            tool_call_id=item.tool_call_id,
            token_count=counts[index],
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            total_tokens=usage.total_tokens if usage else None,
            cached_input_tokens=usage.cached_input_tokens if usage else None,
            cache_write_tokens=usage.cache_write_tokens if usage else None,
            pinned=item.pinned,
            metadata=dict(item.metadata),
            message_hash=item.message_hash,
        )
        to_create.append(event)
        result.append(event)
    return result, to_create


def _stored(row: Session, result: list[Event], created: list[Event]) -> AppendResult:
    """The append's result; its new events are announced once the transaction commits."""
    created_ids = [event.id for event in created]
    created_types = sorted({event.type for event in created})
    transaction.on_commit(
        lambda: announce_appended(
            sender=Session,
            session_id=row.pk,
            event_ids=created_ids,
            event_types=created_types,
            session=row,
        )
    )
    return AppendResult(events=result, created=len(created), session=row)


def _append_direct(
    session: Session,
    prepared: list[tuple[EventInput, str, bool]],
    counts: Mapping[int, int],
    updates: Mapping[str, Any],
    *,
    has_ids: bool,
) -> AppendResult:
    added = _Added(model=session.model)
    for index, (item, text, _) in enumerate(prepared):
        added.add(item, text, counts[index])
    updates = {**updates, **added.values()}
    # The reported totals' bound as a condition of the UPDATE: no row back means the bound,
    # or a missing session, and the careful way tells which.
    bounds = {
        name: bound - value
        for name, value, bound in (
            ("reported_prompt_tokens", added.prompt, MAX_REPORTED_TOTAL),
            ("reported_completion_tokens", added.completion, MAX_REPORTED_TOTAL),
            ("reported_total_tokens", added.total, MAX_REPORTED_TOTAL),
            ("cost_nano_usd", added.cost_nano, pricing.MAX_TOTAL_NANO_USD),
            ("saved_nano_usd", added.saved_nano, pricing.MAX_TOTAL_NANO_USD),
        )
        if value
    }
    if min(bounds.values(), default=0) < 0:
        raise _TakeCarefulPath  # past a bound on its own: the careful way says which
    if connection.vendor == "postgresql":
        return _append_in_one_statement(session, prepared, counts, added, updates, bounds)
    try:
        with transaction.atomic():
            row = _update_returning(
                session.pk, deltas=added.deltas(), values=updates, at_most=bounds
            )
            if row is None:
                raise _TakeCarefulPath
            return _store(row, prepared, counts, {})
    except IntegrityError:
        if not has_ids:
            raise
        raise _TakeCarefulPath from None


def _append_in_one_statement(
    session: Session,
    prepared: list[tuple[EventInput, str, bool]],
    counts: Mapping[int, int],
    added: _Added,
    updates: Mapping[str, Any],
    bounds: Mapping[str, int],
) -> AppendResult:
    """The direct append on PostgreSQL: the counters' UPDATE and the events' INSERT as one
    statement (the INSERT numbers the events from the UPDATE's RETURNING), so outside a
    transaction it is one round trip and commits alone, where BEGIN, UPDATE, INSERT and
    COMMIT took four. A session row the UPDATE does not match (missing, or the reported
    totals' bound) leaves the events without a seq: the statement fails whole, as does one
    with a stored id, and the careful way decides."""
    deltas = added.deltas()
    # Numbered relative to the row's new last_seq, which only the statement knows: the last
    # event 0, the one before it -1, and so on.
    _, to_create = _new_events(prepared, counts, {}, session=session, last_seq=0)
    rows = _event_rows(to_create)
    seq_index = _event_seq_index()
    params: list[Any] = _update_params(session.pk, deltas, updates, bounds)
    for event, row_values in zip(to_create, rows, strict=True):
        row_values[seq_index] = -event.seq  # the statement subtracts it from last_seq
        params.extend(row_values)
    sql = _append_statement_sql(
        connection.vendor, tuple(deltas), tuple(updates), tuple(bounds), len(rows)
    )
    try:
        # A savepoint only inside a caller's transaction, which a failed statement would
        # otherwise abort.
        with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
            found = raw_rows.instances(Session, sql, params)
    except IntegrityError:
        raise _TakeCarefulPath from None
    if not found:
        raise _TakeCarefulPath
    row = found[0]
    for event in to_create:
        event.seq += row.last_seq
        event.session = row
    _mark_stored(to_create)
    return _stored(row, to_create, to_create)


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
) -> str:
    """The one-statement append for these field names and this many events."""
    quote = connection.ops.quote_name
    table, columns, _, _ = _event_insert_parts(vendor)
    seq_index = _event_seq_index()
    last_seq = quote(Session._meta.get_field("last_seq").column)  # type: ignore[union-attr]
    placeholders = ["%s"] * len(Event._meta.concrete_fields)
    placeholders[seq_index] = f"(SELECT {last_seq} FROM updated) - %s"  # noqa: S608
    row = f"({', '.join(placeholders)})"
    update = _update_returning_sql(vendor, deltas, values, at_most)
    # Identifiers come from the models and quote_name, values are parameters.
    return (
        f"WITH updated AS ({update}), "  # noqa: S608
        f"inserted AS (INSERT INTO {table} ({columns}) VALUES {', '.join([row] * rows)}) "
        f"SELECT {raw_rows.columns(Session)} FROM updated"
    )


def _append_careful(
    session: Session,
    prepared: list[tuple[EventInput, str, bool]],
    counts: Mapping[int, int],
    replayed: dict[uuid.UUID, Event],
    updates: Mapping[str, Any],
    seen: set[uuid.UUID],
) -> AppendResult:
    try:
        with transaction.atomic():
            locked = Session.objects.select_for_update().get(pk=session.pk)
            existing = dict(replayed)
            fresh = [entry for entry in prepared if entry[0].id not in replayed]
            existing.update(_stored_replays(locked, fresh, seen - set(replayed)))
            added = _Added(model=locked.model)
            for index, (item, text, _) in enumerate(prepared):
                if item.id is None or item.id not in existing:
                    added.add(item, text, counts[index])
            if not added.count:
                return AppendResult(
                    events=[existing[item.id] for item, _, _ in prepared if item.id is not None],
                    created=0,
                    session=locked,
                )
            _check_reported_totals(
                locked, prompt=added.prompt, completion=added.completion, total=added.total
            )
            _check_bill_totals(locked, added)
            row = _update_returning(
                session.pk, deltas=added.deltas(), values={**updates, **added.values()}
            )
            assert row is not None  # locked above
            return _store(row, prepared, counts, existing)
    except IntegrityError:
        if not seen:
            raise
        # Another session's append stored one of these ids after our check above (its lock
        # is not ours): the same conflict, found late.
        raise _idempotency_conflict() from None


def _check_reported_totals(session: Session, *, prompt: int, completion: int, total: int) -> None:
    for key, current, added in (
        ("totalPromptTokens", session.reported_prompt_tokens, prompt),
        ("totalCompletionTokens", session.reported_completion_tokens, completion),
        ("totalTokens", session.reported_total_tokens, total),
    ):
        if current + added > MAX_REPORTED_TOTAL:
            raise Unprocessable(
                f"this append would take the session's {key} past {MAX_REPORTED_TOTAL}",
                code="token_usage_total_exceeded",
                limit=MAX_REPORTED_TOTAL,
            )


def _check_bill_totals(session: Session, added: _Added) -> None:
    """The session's cost and savings stay within what a bigint holds (nanodollars)."""
    for key, current, more in (
        ("costUsd", session.cost_nano_usd, added.cost_nano),
        ("savedUsd", session.saved_nano_usd, added.saved_nano),
    ):
        if current + more > pricing.MAX_TOTAL_NANO_USD:
            raise Unprocessable(
                f"this append would take the session's {key} past "
                f"{pricing.MAX_TOTAL_NANO_USD // pricing.NANO_PER_USD} USD",
                code="token_usage_total_exceeded",
                limit=pricing.MAX_TOTAL_NANO_USD // pricing.NANO_PER_USD,
            )


def event_set_pinned(*, event: Event, pinned: bool) -> Event:
    """Pin or unpin an event; pinned events are never folded by compaction."""
    Event.objects.filter(pk=event.pk).update(pinned=pinned)
    event.pinned = pinned
    return event


def session_record_compaction(*, session_id: uuid.UUID, snapshot: Mapping[str, Any]) -> None:
    """Store the latest compaction's summary on the session (called by compaction_app)."""
    Session.objects.filter(pk=session_id).update(last_compaction=dict(snapshot))
