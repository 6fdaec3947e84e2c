"""Services: every write to sessions and events goes through here.

Appends lock the session row, so `seq` is gap-free and the counters on the session always
equal the sums over its stored events. Token counting happens before the lock is taken: it
is the expensive part and needs no database.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from sessions_app import tokens
from sessions_app.errors import Conflict, InvalidInput, Unprocessable
from sessions_app.model_registry import ModelRegistry
from sessions_app.models import ROLE_FOR_TYPE, Event, EventType, Session, is_model_visible
from sessions_app.session_settings import validate_settings
from sessions_app.signals import events_appended

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


def _insert_events(events: list[Event]) -> None:
    """INSERT the new events: executemany on SQLite, one COPY on PostgreSQL.

    Equivalent to bulk_create for this model (no signals are attached to Event), but prepares
    only the columns that need it: Django's per-field preparation of every value was the
    largest cost of a 3,000-event bulk append after tokenizing itself.
    """
    now = timezone.now()
    fields = Event._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    # Identifiers come from the model and quote_name, values are parameters.
    sql = f"INSERT INTO {connection.ops.quote_name(Event._meta.db_table)} ({columns}) VALUES ({placeholders})"  # noqa: S608
    prepared = [field.get_internal_type() in _PREPARED_TYPES for field in fields]
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
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # COPY streams the rows in one round trip; executemany costs one per batch.
            copy_sql = (
                f"COPY {connection.ops.quote_name(Event._meta.db_table)} ({columns}) FROM STDIN"
            )
            # The raw psycopg cursor: wrap its errors so a unique violation is IntegrityError.
            with connection.wrap_database_errors, cursor.cursor.copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            for start in range(0, len(rows), 1000):
                cursor.executemany(sql, rows[start : start + 1000])
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


def event_append(*, session: Session, events: Sequence[EventInput]) -> AppendResult:
    """Append one or more events atomically.

    An event whose client-supplied id is already stored is returned as stored when the body is
    the same (a retry changes nothing); a different body, or an id stored in another session,
    is a 409 `idempotency_conflict`. Either every new event is stored or none is.
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

    # Stored events never change their body, so replays found now need no token count; ids
    # stored by a concurrent writer meanwhile are caught again under the lock below.
    replayed = _stored_replays(session, prepared, seen)
    fresh = [index for index, entry in enumerate(prepared) if entry[0].id not in replayed]
    counter = tokens.counter_for_model(session.model)
    fresh_counts = tokens.messages_batch_tokens(
        counter,
        [
            (ROLE_FOR_TYPE[prepared[i][0].type], prepared[i][0].content, prepared[i][0].name)
            for i in fresh
        ],
    )
    counts = dict(zip(fresh, fresh_counts, strict=True))

    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        existing = dict(replayed)
        existing.update(_stored_replays(locked, [prepared[i] for i in fresh], seen - set(replayed)))

        to_create: list[Event] = []
        result: list[Event] = []
        seq = locked.last_seq
        added_active = added_active_tokens = added_ledger = added_cumulative = 0
        added_prompt = added_completion = added_total = added_reported = 0
        for index, (item, text, is_json) in enumerate(prepared):
            if item.id is not None and item.id in existing:
                result.append(existing[item.id])
                continue
            count = counts[index]
            seq += 1
            usage = item.token_usage
            event = Event(
                id=item.id or uuid.uuid4(),
                session=locked,
                seq=seq,
                type=item.type,
                content=text,
                content_is_json=is_json,
                name=item.name,
                tool_call_id=item.tool_call_id,
                token_count=count,
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
                total_tokens=usage.total_tokens if usage else None,
                pinned=item.pinned,
                metadata=dict(item.metadata),
                message_hash=item.message_hash,
            )
            to_create.append(event)
            result.append(event)
            added_ledger += count
            if is_model_visible(item.type, text):
                added_active += 1
                added_active_tokens += count
            # Synthetic turns (a refresh, a summary) do not count toward the next refresh.
            if item.type not in (EventType.CONTEXT_REFRESH, EventType.COMPACTION):
                added_cumulative += count
            if usage is not None:
                added_reported += 1
                added_prompt += usage.prompt_tokens or 0
                added_completion += usage.completion_tokens or 0
                added_total += usage.total_tokens or 0

        if to_create:
            _check_reported_totals(
                locked, prompt=added_prompt, completion=added_completion, total=added_total
            )
            try:
                with transaction.atomic():
                    _insert_events(to_create)
            except IntegrityError:
                if not seen:
                    raise
                # Another session's append stored one of these ids after our check above
                # (its lock is not ours): the same conflict, found late.
                raise _idempotency_conflict() from None
            locked.last_seq = seq
            locked.event_count += len(to_create)
            locked.active_event_count += added_active
            locked.active_tokens += added_active_tokens
            locked.ledger_tokens += added_ledger
            locked.cumulative_tokens += added_cumulative
            locked.reported_prompt_tokens += added_prompt
            locked.reported_completion_tokens += added_completion
            locked.reported_total_tokens += added_total
            locked.reported_event_count += added_reported
            locked.save(
                update_fields=[
                    "last_seq",
                    "event_count",
                    "active_event_count",
                    "active_tokens",
                    "ledger_tokens",
                    "cumulative_tokens",
                    "reported_prompt_tokens",
                    "reported_completion_tokens",
                    "reported_total_tokens",
                    "reported_event_count",
                    "updated_at",
                ]
            )
            created_ids = [event.id for event in to_create]
            created_types = sorted({event.type for event in to_create})
            committed = locked
            transaction.on_commit(
                lambda: events_appended.send(
                    sender=Session,
                    session_id=committed.pk,
                    event_ids=created_ids,
                    event_types=created_types,
                    session=committed,
                )
            )
    return AppendResult(events=result, created=len(to_create), session=locked)


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


def event_set_pinned(*, event: Event, pinned: bool) -> Event:
    """Pin or unpin an event; pinned events are never folded by compaction."""
    Event.objects.filter(pk=event.pk).update(pinned=pinned)
    event.pinned = pinned
    return event


def session_record_compaction(*, session_id: uuid.UUID, snapshot: Mapping[str, Any]) -> None:
    """Store the latest compaction's summary on the session (called by compaction_app)."""
    Session.objects.filter(pk=session_id).update(last_compaction=dict(snapshot))
