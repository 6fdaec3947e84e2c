"""Selectors: reads. Usage comes from the session's stored counters, never a recount."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import Coalesce

from sessions_app import render, scope, tokens
from sessions_app.context_window import ALWAYS_KEPT_TYPES, USER_TYPES
from sessions_app.errors import NotFound
from sessions_app.exact_counts import exact_counting_enabled
from sessions_app.models import Event, EventType, Session, TokenProvenance
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


def usage_for_session(*, session: Session, thread: str | None = None) -> dict[str, Any]:
    """The usage document of the design under the scope rule (sessions_app.scope): context
    figures of `thread` (None: the main thread), the session's bill; from counters only."""
    return scope.usage_document(
        session=session, thread=thread, extra={"exact": counter_is_exact(session=session)}
    )


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


@dataclass(frozen=True, slots=True)
class EventHead:
    """What the window math needs of an active event, without its content: a session of a
    million tokens is measured and pruned from these, and only the events kept are read
    whole (`events_by_id`)."""

    seq: int
    type: str
    cost: int
    tool_call_id: str

    @property
    def id(self) -> int:
        """Its key in the window math: the seq (one per session), not the event's UUID, whose
        conversion on every row of a long session cost more than the rest of the read."""
        return self.seq


def active_heads(*, session: Session) -> list[EventHead]:
    """The active context's events, content left out, in send order (system prompts, the
    summary, then every other event by seq, as `render.context_order`)."""
    rows = Event.objects.filter(session=session).active().order_by("seq").values_list(*_HEAD_FIELDS)
    return _send_order(_heads(rows))


def _send_order(heads: list[EventHead]) -> list[EventHead]:
    """`heads` (by seq) in send order, as `render.context_order`: the system prompts, the
    summary, then every other event."""
    first = (EventType.SYSTEM_PROMPT, EventType.COMPACTION)
    return (
        [h for h in heads if h.type == EventType.SYSTEM_PROMPT]
        + [h for h in heads if h.type == EventType.COMPACTION]
        + [h for h in heads if h.type not in first]
    )


_HEAD_FIELDS = ("seq", "type", "token_count", "cleared_token_count", "tool_call_id")
_TAIL_BATCH = 500


def _heads(rows: Any) -> list[EventHead]:
    return [
        EventHead(seq, kind, cleared if cleared is not None else cost, call)
        for seq, kind, cost, cleared, call in rows
    ]


def active_cost(*, session: Session) -> tuple[int, int]:
    """(events, tokens) of the active context, summed by the database: what `active_heads`
    would add up, without reading a row per event."""
    totals = (
        Event.objects.filter(session=session)
        .active()
        .aggregate(
            events=Count("seq"),
            tokens=Sum(Coalesce("cleared_token_count", "token_count")),
        )
    )
    return totals["events"] or 0, totals["tokens"] or 0


def active_tail_heads(*, session: Session, covering: int) -> list[EventHead] | None:
    """The heads a prune to `covering` tokens can keep, in send order: the system prompts and
    the summary, the last user message, and the newest events until their costs pass
    `covering`, extended so that every tool result in it has its call (a prune keeps a call
    and its results together, and stops at the first unit that does not fit: nothing older
    than this tail could be kept). None when the tail would be the whole context (the caller
    reads `active_heads`)."""
    if covering < 0:
        return None
    active = Event.objects.filter(session=session).active()
    tail: list[EventHead] = []
    total = 0
    oldest: int | None = None
    while total <= covering:
        batch = active.order_by("-seq")
        if oldest is not None:
            batch = batch.filter(seq__lt=oldest)
        rows = _heads(batch.values_list(*_HEAD_FIELDS)[:_TAIL_BATCH])
        if len(rows) < _TAIL_BATCH and total + sum(h.cost for h in rows) <= covering:
            return None
        for head in rows:
            tail.append(head)
            total += head.cost
            oldest = head.seq
            if total > covering:
                break
    assert oldest is not None
    while True:
        calls = {h.tool_call_id for h in tail if h.type == EventType.TOOL_CALL}
        orphans = {
            h.tool_call_id
            for h in tail
            if h.type == EventType.TOOL_RESULT and h.tool_call_id and h.tool_call_id not in calls
        }
        start = (
            active.filter(seq__lt=oldest, type=EventType.TOOL_CALL, tool_call_id__in=orphans)
            .order_by("seq")
            .values_list("seq", flat=True)
            .first()
            if orphans
            else None
        )
        if start is None:
            break
        tail += _heads(
            active.filter(seq__gte=start, seq__lt=oldest)
            .order_by("-seq")
            .values_list(*_HEAD_FIELDS)
        )
        oldest = start
    tail.reverse()
    leading = _heads(
        active.filter(type__in=ALWAYS_KEPT_TYPES, seq__lt=oldest)
        .order_by("seq")
        .values_list(*_HEAD_FIELDS)
    )
    # The last user message, read only when the tail holds none.
    last_user = (
        []
        if any(h.type in USER_TYPES for h in tail)
        else _heads(
            active.filter(type__in=USER_TYPES, seq__lt=oldest)
            .order_by("-seq")
            .values_list(*_HEAD_FIELDS)[:1]
        )
    )
    return _send_order(sorted([*leading, *last_user, *tail], key=lambda h: h.seq))


def events_of(*, session: Session, heads: Sequence[EventHead]) -> list[Event]:
    """The events `heads` stand for, whole, in send order (`render.context_order`). Read as
    the system prompts and the summary by seq, then one range from the oldest other event on:
    what fitting keeps is a recent tail, and a list of thousands of ids in one IN costs more
    than the rows."""
    if not heads:
        return []
    wanted = {head.seq for head in heads}
    first = (EventType.SYSTEM_PROMPT, EventType.COMPACTION)
    leading = [head.seq for head in heads if head.type in first]
    tail = [head.seq for head in heads if head.type not in first]
    events: list[Event] = []
    for start in range(0, len(leading), 500):
        events += Event.objects.filter(session=session, seq__in=leading[start : start + 500])
    if tail:
        events += Event.objects.filter(session=session, seq__gte=min(tail)).active()
    chosen = sorted({e.seq: e for e in events if e.seq in wanted}.values(), key=lambda e: e.seq)
    return render.context_order(chosen)


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
