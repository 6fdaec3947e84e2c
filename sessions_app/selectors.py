"""Selectors: reads. Usage comes from the session's stored counters, never a recount."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from sessions_app import tokens
from sessions_app.errors import NotFound
from sessions_app.models import Event, EventType, Session


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
    settings = session.settings
    ratio = session.usage_ratio
    return {
        "totalPromptTokens": session.reported_prompt_tokens,
        "totalCompletionTokens": session.reported_completion_tokens,
        "totalTokens": session.reported_total_tokens,
        "eventCount": session.reported_event_count,
        "contextTokens": session.context_tokens,
        "contextLimit": session.context_limit,
        "percentUsed": session.percent_used,
        "nearLimit": ratio >= settings.get("compactThreshold", 0.8),
        "atLimit": ratio >= settings.get("hardLimitThreshold", 0.95),
        "model": session.model,
        "encoding": session.encoding,
        "exact": counter_is_exact(session=session),
        "cumulativeTokens": session.cumulative_tokens,
        "refreshThresholdTokens": settings.get("refreshThresholdTokens", 800_000),
        "lastCompaction": session.last_compaction,
        "lastProviderPromptTokens": session.last_provider_prompt_tokens,
        "countDriftPercent": count_drift_percent(session=session),
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
    are counted with cl100k_base as a documented approximation)."""
    counter = tokens.counter_for_model(session.model)
    return bool(counter.exact and tokens.resolve_encoding(session.model).native)


def events_page(
    *, session: Session, after: int = 0, limit: int = 100, include_compacted: bool = False
) -> tuple[list[Event], int | None]:
    """Events with seq > after, in order; returns the page and the cursor for the next one."""
    queryset = Event.objects.filter(session=session, seq__gt=after)
    if not include_compacted:
        queryset = queryset.filter(compacted_by__isnull=True)
    page = list(queryset.order_by("seq")[: limit + 1])
    next_after = page[limit - 1].seq if len(page) > limit else None
    return page[:limit], next_after


def active_events(*, session: Session) -> list[Event]:
    """The active context in send order: system prompts, the summary, then every event not
    folded, by seq."""
    events = list(Event.objects.filter(session=session).active().order_by("seq"))
    first = (EventType.SYSTEM_PROMPT, EventType.COMPACTION)
    system = [event for event in events if event.type == EventType.SYSTEM_PROMPT]
    summaries = [event for event in events if event.type == EventType.COMPACTION]
    rest = [event for event in events if event.type not in first]
    return system + summaries + rest


def event_content(event: Event) -> Any:
    """The content sent to the model: the placeholder when a tool result was cleared."""
    if event.cleared_content is not None:
        return event.cleared_content
    return json.loads(event.content) if event.content_is_json else event.content


def render_messages(
    events: list[Event], *, fmt: str = "openai"
) -> tuple[list[dict[str, Any]], str | None]:
    """Messages in a provider's chat format; for anthropic the system text is returned apart."""
    if fmt == "anthropic":
        return _render_anthropic(events)
    messages: list[dict[str, Any]] = []
    # The assistant turn later tool calls join: parallel calls (and the text the assistant
    # said before them) are one turn in OpenAI's format, since a tool_calls turn must be
    # followed directly by its tool messages.
    agent_turn: dict[str, Any] | None = None
    for event in events:
        content = event_content(event)
        if event.type == EventType.TOOL_CALL:
            arguments = content if isinstance(content, str) else json.dumps(content)
            call = {
                "id": event.tool_call_id,
                "type": "function",
                "function": {"name": event.name, "arguments": arguments},
            }
            if agent_turn is not None:
                agent_turn.setdefault("tool_calls", []).append(call)
            else:
                agent_turn = {"role": "assistant", "content": None, "tool_calls": [call]}
                messages.append(agent_turn)
            continue
        if event.type == EventType.TOOL_RESULT:
            messages.append(
                {"role": "tool", "tool_call_id": event.tool_call_id, "content": content}
            )
            agent_turn = None
        else:
            message: dict[str, Any] = {"role": event.role, "content": content}
            if event.name and event.type != EventType.COMPACTION:
                message["name"] = event.name
            messages.append(message)
            agent_turn = message if event.type == EventType.AGENT_MESSAGE else None
    return messages, None


def _render_anthropic(events: list[Event]) -> tuple[list[dict[str, Any]], str | None]:
    system_parts: list[str] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        # Anthropic wants alternating roles: consecutive same-role turns merge their blocks.
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for event in events:
        content = event_content(event)
        text = content if isinstance(content, str) else json.dumps(content)
        if event.type in (EventType.SYSTEM_PROMPT, EventType.COMPACTION):
            system_parts.append(text)
        elif event.type == EventType.TOOL_CALL:
            try:
                arguments = content if isinstance(content, dict) else json.loads(text)
            except json.JSONDecodeError:
                arguments = {"input": text}
            add(
                "assistant",
                {
                    "type": "tool_use",
                    "id": event.tool_call_id,
                    "name": event.name,
                    "input": arguments,
                },
            )
        elif event.type == EventType.TOOL_RESULT:
            add("user", {"type": "tool_result", "tool_use_id": event.tool_call_id, "content": text})
        else:
            add(
                "assistant" if event.role == "assistant" else "user", {"type": "text", "text": text}
            )
    return messages, ("\n\n".join(system_parts) or None)


def active_summary(*, session: Session) -> Event | None:
    return (
        Event.objects.filter(session=session, type=EventType.COMPACTION)
        .active()
        .order_by("-seq")
        .first()
    )
