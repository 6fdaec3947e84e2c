"""Services: every write to sessions and events goes through here.

This module holds the policy: what a session, a settings change or an event must look like to
be stored (clear 4xx errors otherwise). How validated events are stored with the session's
counters (gap-free `seq`, counters always equal to the sums over the stored events, idempotent
retries) is the append engine's, in `sessions_app.append`; its input and result types are
re-exported here, where callers have always found them. Token counting happens before any
lock is taken: it is the expensive part and needs no database.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import Count, F, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from sessions_app import scope, tokens
from sessions_app.append import (
    MAX_REPORTED_TOTAL,
    AppendResult,
    EventInput,
    Prepared,
    TokenUsage,
    append_prepared,
    bill_again,
)
from sessions_app.calls import calls_attach
from sessions_app.errors import InvalidInput
from sessions_app.model_registry import ModelRegistry
from sessions_app.models import Event, EventType, Session, Thread
from sessions_app.session_settings import validate_settings
from sessions_app.sql import RowUpdate
from sessions_app.storable import SURROGATE

logger = logging.getLogger("sessions_app")

__all__ = [
    "COMPACT_COMMAND",
    "MAX_CONTEXT_LIMIT",
    "MAX_REPORTED_TOKENS",
    "MAX_REPORTED_TOTAL",
    "AppendResult",
    "RowUpdate",
    "EventInput",
    "TokenUsage",
    "check_text",
    "event_append",
    "event_set_pinned",
    "model_registry",
    "session_create",
    "session_delete",
    "session_record_compaction",
    "session_update",
]

MAX_CONTEXT_LIMIT = 100_000_000
# Provider-reported usage: one value stays far below PostgreSQL's bigint, and one huge report
# cannot fill a session's totals (MAX_REPORTED_TOTAL, the engine's bound) on its own.
MAX_REPORTED_TOKENS = 10**12
COMPACT_COMMAND = "/compact"


@lru_cache(maxsize=1)
def _registry_cached(overrides_json: str) -> ModelRegistry:
    return ModelRegistry(overrides=json.loads(overrides_json))


def model_registry() -> ModelRegistry:
    """The registry with the overrides currently in settings (cached per overrides value)."""
    return _registry_cached(json.dumps(django_settings.MODEL_CONTEXT_OVERRIDES, sort_keys=True))


def check_text(value: str, where: str) -> None:
    if "\x00" in value:
        raise InvalidInput(
            "NUL bytes are not allowed",
            code="invalid_content",
            fields={where: "contains a NUL byte"},
        )
    # Searched for, not encoded: encoding a 30 MB content to find out made a copy of it.
    if not value.isascii() and SURROGATE.search(value):
        raise InvalidInput(
            "text must be valid Unicode",
            code="invalid_content",
            fields={where: "contains a lone surrogate"},
        )


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
    elif isinstance(value, float) and not math.isfinite(value):
        # Stored, it would be written as Infinity or NaN, which no JSON renderer reads back:
        # every read of the session would fail. The gateway records such a number as its text
        # (sessions_app.storable) before it gets here.
        raise InvalidInput(
            "numbers must be finite",
            code="number_out_of_range",
            fields={where: "holds a number that is not finite (too large for a double)"},
        )


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
    # Only a missing value means the defaults: `false` or `[]` is refused like any non-object.
    resolved = validate_settings({} if settings is None else settings)
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
        if client_key:
            # Calls refused before this key had a session (a typo'd model, bad JSON) join it.
            calls_attach(owner_id=owner.pk, session_key=client_key, session_id=session.pk)
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


_DELETE_ATTEMPTS = 3


def session_delete(*, session: Session) -> None:
    """Delete the session and everything it holds. Appends, compaction runs and counters
    write under the session's row lock: taken first, the cascade waits for a writer under way
    and no row of the session comes after it (otherwise the cascade locks the events before
    the session, the other order from a writer's, and PostgreSQL breaks the deadlock by
    failing one). A conflict a concurrent writer still causes (a row it inserted after the
    cascade collected, a deadlock with a task that locks events first) is retried."""
    for attempt in range(_DELETE_ATTEMPTS):
        try:
            with transaction.atomic():
                locked = Session.objects.select_for_update().filter(pk=session.pk).first()
                if locked is not None:
                    locked.delete()
            return
        except (IntegrityError, OperationalError):
            if attempt == _DELETE_ATTEMPTS - 1:
                raise


def _content_for_storage(content: Any, where: str) -> tuple[str, bool]:
    if isinstance(content, str):
        check_text(content, where)
        return content, False
    _check_json_text(content, where)
    return json.dumps(content, ensure_ascii=False, separators=(",", ":")), True


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
        "reasoningTokens": usage.reasoning_tokens,
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
    if usage.total_tokens is None and (
        usage.prompt_tokens is not None or usage.completion_tokens is not None
    ):
        # A total the client left out is prompt + completion (what every provider reports),
        # so the session's totalTokens never reads 0 beside a prompt and a completion.
        total = (usage.prompt_tokens or 0) + (usage.completion_tokens or 0)
        if total > MAX_REPORTED_TOKENS:
            raise InvalidInput(
                f"tokenUsage without totalTokens: promptTokens + completionTokens (its total) "
                f"must be at most {MAX_REPORTED_TOKENS}",
                code="invalid_request",
                fields={f"[{index}].tokenUsage.totalTokens": "give it, or smaller parts"},
            )
        usage = replace(usage, total_tokens=total)
    return usage


def event_append(
    *,
    session: Session,
    events: Sequence[EventInput],
    session_updates: Mapping[str, Any] | None = None,
    also_update: RowUpdate | None = None,
) -> AppendResult:
    """Append one or more events atomically.

    An event whose client-supplied id is already stored is returned as stored when the body is
    the same (a retry changes nothing); a different body, or an id stored in another session,
    is a 409 `idempotency_conflict`. Either every new event is stored or none is.

    `session_updates` (field name to plain value) are set on the session row in the same
    UPDATE as the counters, when something new is stored: the gateway's per-session
    bookkeeping rides along without a statement of its own.

    `also_update` is another row brought up to date in the append's own transaction (in its
    one statement on PostgreSQL) whenever the append succeeds, a full replay included: a
    caller's bookkeeping row commits with the events, with no commit of its own.
    """
    if not events:
        raise InvalidInput(
            "no events given", code="empty_request", fields={"events": "must not be empty"}
        )
    seen: set[uuid.UUID] = set()
    prepared: list[Prepared] = []
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

    return append_prepared(
        session=session,
        prepared=prepared,
        ids=seen,
        session_updates=session_updates or {},
        also=also_update,
    )


def event_set_pinned(*, event: Event, pinned: bool) -> Event:
    """Pin or unpin an event; pinned events are never folded by compaction."""
    Event.objects.filter(pk=event.pk).update(pinned=pinned)
    event.pinned = pinned
    return event


def session_record_compaction(*, session_id: uuid.UUID, snapshot: Mapping[str, Any]) -> None:
    """Store the latest compaction's summary on the session (called by compaction_app)."""
    Session.objects.filter(pk=session_id).update(last_compaction=dict(snapshot))


# --- compaction's writes: fold, clear, revert, counters ---------------------------------------
# compaction_app decides what to fold and clear; the ledger's rows change only here. Each runs
# inside the caller's transaction, which holds the session's row lock.


@dataclass(frozen=True)
class Clearing:
    """A tool result a compaction clears: its placeholder and what the placeholder costs."""

    event_id: str
    placeholder: str
    token_count: int


def events_fold(*, event_ids: Sequence[uuid.UUID], marker: Event) -> None:
    """Fold the events into the COMPACTION event `marker` (they leave the active context)."""
    if event_ids:
        Event.objects.filter(pk__in=list(event_ids)).update(compacted_by=marker)


def events_clear(*, clearings: Sequence[Clearing], marker: Event) -> None:
    """Replace each tool result's content by its placeholder in the active context (the
    original stays stored); an event folded or pinned meanwhile is left as it is."""
    for clearing in clearings:
        Event.objects.filter(pk=clearing.event_id, compacted_by__isnull=True, pinned=False).update(
            cleared_content=clearing.placeholder,
            cleared_token_count=clearing.token_count,
            cleared_by=marker,
        )


def compaction_undo(*, session: Session, marker_id: uuid.UUID, refresh: bool) -> None:
    """Undo what the COMPACTION event `marker_id` did: its folded events become active again,
    its cleared tool results get their content back, and it is marked reverted; with
    `refresh`, the CONTEXT_REFRESH events after it are reverted too."""
    Event.objects.filter(compacted_by_id=marker_id).update(compacted_by=None)
    Event.objects.filter(cleared_by_id=marker_id).update(
        cleared_content=None, cleared_token_count=None, cleared_by=None
    )
    Event.objects.filter(pk=marker_id).update(reverted=True)
    if refresh:
        Event.objects.filter(
            session=session,
            type=EventType.CONTEXT_REFRESH,
            seq__gt=Event.objects.get(pk=marker_id).seq,
            compacted_by__isnull=True,
        ).update(reverted=True)


def session_recount_active(*, session_id: uuid.UUID) -> Session:
    """Recount the active-context counters from the events (compaction is O(n) anyway, and a
    recount cannot drift); the session as it is now. The caller holds the row lock."""
    totals = (
        Event.objects.filter(session_id=session_id)
        .active()
        .aggregate(
            count=Count("id"),
            tokens=Coalesce(Sum(Coalesce("cleared_token_count", "token_count")), 0),
        )
    )
    Session.objects.filter(pk=session_id).update(
        active_event_count=totals["count"],
        active_tokens=totals["tokens"],
        updated_at=timezone.now(),
    )
    return Session.objects.get(pk=session_id)


def session_take_cumulative(*, session_id: uuid.UUID, threshold: int) -> bool:
    """Reset the cumulative counter when it reached `threshold`; conditional, so of
    concurrent appenders only one wins (True)."""
    return bool(
        Session.objects.filter(pk=session_id, cumulative_tokens__gte=threshold).update(
            cumulative_tokens=0
        )
    )


def session_give_back_cumulative(*, session_id: uuid.UUID, tokens: int) -> None:
    """Add `tokens` back to the cumulative counter (a refresh that could not start)."""
    Session.objects.filter(pk=session_id).update(cumulative_tokens=F("cumulative_tokens") + tokens)


# --- the gateway's writes: threads and what a reply leaves on the session ------------------------

# What a recorded reply may set on its session outside an append (the append sets the same).
REPLY_SESSION_FIELDS = frozenset(
    {"last_serving_model", "last_forwarded_tokens", "last_provider_prompt_tokens"}
)


def thread_get_or_create(
    *, session: Session, key: str, named: bool, anchor_index: int, anchor_hash: str
) -> tuple[Thread, bool]:
    """The session's thread `key`, created with its anchor when new (True); two first calls
    of one thread racing create it once."""
    thread = Thread.objects.filter(session=session, key=key).first()
    if thread is not None:
        return thread, False
    try:
        with transaction.atomic():
            created = Thread.objects.create(
                session=session,
                key=key,
                named=named,
                anchor_index=anchor_index,
                anchor_hash=anchor_hash,
            )
        # The usage figures' cached view of the session's threads is stale (scope.py).
        transaction.on_commit(lambda: scope.forget_threads(session_id=session.pk))
        return created, True
    except IntegrityError:
        return Thread.objects.get(session=session, key=key), False


def thread_remember(*, update: RowUpdate) -> None:
    """Apply a thread's remembered history (`update`, built for an append to carry) on its
    own: its values set, its counters added to."""
    if update.model is not Thread:
        raise ValueError("thread_remember takes a Thread update")
    Thread.objects.filter(pk=update.pk).update(
        **update.values, **{name: F(name) + value for name, value in update.deltas.items()}
    )


def thread_note_error(*, session: Session, thread: Thread | None, text: str, main_key: str) -> bool:
    """Show a bookkeeping failure on `thread`, else on the session's first thread, else on a
    new `main_key` thread (True when that one was created)."""
    target = thread or Thread.objects.filter(session=session).order_by("created_at").first()
    created = False
    if target is None:
        target = Thread.objects.create(session=session, key=main_key)
        created = True
    Thread.objects.filter(pk=target.pk).update(last_error=text[:500])
    return created


def session_add_estimate(*, session_id: uuid.UUID, nano_usd: int) -> None:
    """Count a call the provider answered without usage, at the gateway's estimate of its
    price (kept apart from the provider-reported cost)."""
    Session.objects.filter(pk=session_id).update(
        estimated_calls=F("estimated_calls") + 1,
        estimated_cost_nano_usd=F("estimated_cost_nano_usd") + max(nano_usd, 0),
    )


def session_add_compaction_net(*, session_id: uuid.UUID, nano_usd: int) -> None:
    """Add what a gateway call saved (or cost) because of a compaction before it to the
    session's total (compaction_app.economics measures it)."""
    Session.objects.filter(pk=session_id).update(
        compaction_net_nano_usd=F("compaction_net_nano_usd") + nano_usd
    )


def session_bill_call_again(
    *, session_id: uuid.UUID, model: str, usage: TokenUsage, saved_tokens: int = 0
) -> None:
    """A call the provider answered whose reply the ledger already held (a retry, the same
    request sent twice): the provider billed it, so the session's bill counts it (tokens,
    cache, cost, savings); no event is stored (sessions_app.scope)."""
    if not bill_again(session_id=session_id, model=model, usage=usage, saved_tokens=saved_tokens):
        logger.warning("session %s: a retried call's usage is past the bill's bound", session_id)


def session_note_reply(*, session_id: uuid.UUID, updates: Mapping[str, Any]) -> None:
    """What a recorded reply leaves on its session when it appends nothing (the serving
    model, the forwarded and provider-counted prompt tokens)."""
    unknown = set(updates) - REPLY_SESSION_FIELDS
    if unknown:
        raise ValueError(f"not a reply's session field: {', '.join(sorted(unknown))}")
    Session.objects.filter(pk=session_id).update(**updates)
