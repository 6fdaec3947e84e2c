"""Selectors: reads. Usage comes from the session's stored counters, never a recount."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from sessions_app import pricing, render, tokens
from sessions_app.errors import NotFound
from sessions_app.exact_counts import exact_counting_enabled
from sessions_app.models import Event, EventType, Session, TokenProvenance
from sessions_app.session_settings import SessionSettings
from sessions_app.storable import load_stored


def sessions_visible_to(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Session]:
    """Staff see every session; everyone else only their own."""
    queryset = Session.objects.all()
    if not getattr(user, "is_staff", False):
        queryset = queryset.filter(owner_id=user.pk)
    return queryset


def session_get(*, user: AbstractBaseUser | AnonymousUser, session_id: Any) -> Session:
    """A session the user may see; another user's session is indistinguishable from none."""
    try:
        key = uuid.UUID(str(session_id))
    except ValueError:
        raise NotFound("session not found") from None
    try:
        return sessions_visible_to(user=user).get(pk=key)
    except Session.DoesNotExist:
        raise NotFound("session not found") from None


def event_get(*, session: Session, event_id: Any) -> Event:
    try:
        key = uuid.UUID(str(event_id))
        return Event.objects.get(session=session, pk=key)
    except (ValueError, Event.DoesNotExist):
        raise NotFound("event not found") from None


def usage_for_session(*, session: Session) -> dict[str, Any]:
    """The usage document of the design, from counters only (O(1) in session size)."""
    settings = SessionSettings.of(session.settings)
    level = session.window_level()
    return {
        "totalPromptTokens": session.reported_prompt_tokens,
        "totalCompletionTokens": session.reported_completion_tokens,
        "totalTokens": session.reported_total_tokens,
        "reportedEventCount": session.reported_event_count,
        "contextTokens": session.context_tokens,
        "contextLimit": session.context_limit,
        "percentUsed": level.percent_used,
        "nearLimit": level.near_limit,
        "atLimit": level.at_limit,
        "model": session.model,
        "encoding": session.encoding,
        "exact": counter_is_exact(session=session),
        "cumulativeTokens": session.cumulative_tokens,
        "refreshThresholdTokens": settings.refresh_threshold_tokens,
        "lastCompaction": session.last_compaction,
        "lastProviderPromptTokens": session.last_provider_prompt_tokens,
        "countDriftPercent": count_drift_percent(session=session),
        **bill_for_session(session=session),
    }


def bill_for_session(*, session: Session) -> dict[str, Any]:
    """The provider bill from the session's counters: cache figures, cost and savings."""
    unknown = None
    if session.unpriced_calls:
        unknown = (
            f"no price is known for model {session.unpriced_model!r} "
            f"({session.unpriced_calls} call{'s' if session.unpriced_calls != 1 else ''})"
        )
    return {
        "cachedInputTokens": session.reported_cached_input_tokens,
        "cacheWriteTokens": session.reported_cache_write_tokens,
        "cacheHitRate": pricing.hit_rate(
            cached=session.reported_cached_input_tokens,
            input_tokens=session.reported_prompt_tokens,
        ),
        "costUsd": None if unknown else pricing.usd(session.cost_nano_usd),
        "costUnknownReason": unknown,
        "savedTokens": session.saved_tokens,
        "savedUsd": None if unknown else pricing.usd(session.saved_nano_usd),
    }


def count_drift_percent(*, session: Session) -> float | None:
    """How far the provider's reported prompt tokens for the last gateway call were from our
    count of what was forwarded: 100 × (provider − ours) / ours, one decimal."""
    ours, theirs = session.last_forwarded_tokens, session.last_provider_prompt_tokens
    if not ours or theirs is None:
        return None
    return round(100 * (theirs - ours) / ours, 1)


def counter_is_exact(*, session: Session) -> bool:
    """Counts are exact when the encoding loaded and is the model's own (Claude and Gemini
    are counted with cl100k_base as a documented approximation). A Claude session counted by
    Anthropic's API is exact once every event of its active context has the API's count."""
    if exact_counting_enabled(model=session.model):
        return (
            session.active_event_count > 0
            and not session.events.active()
            .exclude(token_provenance=TokenProvenance.ANTHROPIC_API)
            .exists()
        )
    counter = tokens.counter_for_model(session.model)
    return bool(counter.exact and tokens.resolve_encoding(session.model).native)


def events_page(
    *,
    session: Session,
    after: int = 0,
    limit: int = 100,
    include_compacted: bool = False,
    thread: str | None = None,
) -> tuple[list[Event], int | None]:
    """Events with seq > after, in order; returns the page and the cursor for the next one.
    By default only events still standing: not folded, not a reverted run's. `thread`: only
    the events the gateway recorded in that thread."""
    queryset = Event.objects.filter(session=session, seq__gt=after)
    if thread is not None:
        queryset = queryset.filter(metadata__thread=thread)
    if not include_compacted:
        # A reverted run's COMPACTION event (and a reverted refresh's CONTEXT_REFRESH) is
        # history, like a folded event: listed only with includeCompacted.
        queryset = queryset.filter(compacted_by__isnull=True, reverted=False)
    page = list(queryset.order_by("seq")[: limit + 1])
    next_after = page[limit - 1].seq if len(page) > limit else None
    return page[:limit], next_after


def active_events(*, session: Session) -> list[Event]:
    """The active context in send order (render.context_order): system prompts, the summary,
    then every event not folded, by seq."""
    return render.context_order(
        list(Event.objects.filter(session=session).active().order_by("seq"))
    )


def event_content(event: Event) -> Any:
    """The content sent to the model: the placeholder when a tool result was cleared."""
    if event.cleared_content is not None:
        return event.cleared_content
    return load_stored(event.content) if event.content_is_json else event.content


def event_record(event: Event, *, original: bool = False) -> render.Record:
    """An event as the renderer takes it; `original` sends a cleared tool result's original
    content instead of its placeholder (the export's choice)."""
    content = (
        (load_stored(event.content) if event.content_is_json else event.content)
        if original
        else event_content(event)
    )
    return render.Record(
        key=str(event.id),
        type=event.type,
        content=content,
        name=event.name,
        tool_call_id=event.tool_call_id,
    )


def render_context(events: list[Event], *, fmt: str = "openai") -> render.Rendered:
    """Events rendered for a provider, valid whatever they hold (see sessions_app.render)."""
    return render.render([event_record(event) for event in events], fmt=fmt)


def render_messages(
    events: list[Event], *, fmt: str = "openai"
) -> tuple[list[dict[str, Any]], str | None]:
    """Messages in a provider's chat format; for anthropic the system text is returned apart."""
    rendered = render_context(events, fmt=fmt)
    return rendered.messages, rendered.system


def active_summary(*, session: Session) -> Event | None:
    return (
        Event.objects.filter(session=session, type=EventType.COMPACTION)
        .active()
        .order_by("-seq")
        .first()
    )
