"""Exact token counts for Claude sessions from Anthropic's count-tokens API.

Never in the request path: an append stores the local (tiktoken cl100k) count at once, with
provenance `local`, and a receiver (`sessions_app.receivers.schedule_exact_count`) enqueues
`sessions_app.tasks.count_exact_tokens`, which asks the API here and replaces the counts (provenance `anthropic-api`), moving the session's counters by the
difference and announcing it (`token_counts_updated` → USAGE_UPDATED).

How a message is priced: the count of the request up to and including it minus the count up to
the message before (the first message: minus the system prompt's cost). The stored numbers
therefore add up to what the whole conversation counts as one request. The system prompt's cost
is the difference it makes to a one-character request, cached by a hash of its content.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from sessions_app.anthropic_counter import (
    PAD_MESSAGE,
    AnthropicCountClient,
    CountError,
    LedgerMessage,
    is_claude,
    to_anthropic_messages,
)
from sessions_app.models import Event, EventType, Session, TokenProvenance
from sessions_app.signals import token_counts_updated

__all__ = [
    "CountError",
    "count_client",
    "count_session_exactly",
    "exact_counting_enabled",
]

_SYSTEM_CACHE_SECONDS = 30 * 24 * 3600


def exact_counting_enabled(*, model: str) -> bool:
    """Whether sessions on `model` are counted by the API (a key, the switch, a Claude model)."""
    return bool(
        settings.LEDGER_ANTHROPIC_COUNT_TOKENS and settings.ANTHROPIC_API_KEY and is_claude(model)
    )


def count_client() -> AnthropicCountClient:
    return AnthropicCountClient(
        api_key=settings.ANTHROPIC_API_KEY,
        base_url=settings.LEDGER_ANTHROPIC_UPSTREAM,
        timeout=settings.LEDGER_ANTHROPIC_COUNT_TIMEOUT_SECONDS,
    )


def _system_cost(client: AnthropicCountClient, *, model: str, system: str) -> int:
    digest = hashlib.sha256(system.encode()).hexdigest()
    key = f"anthropic-count:system:{model}:{digest}"
    cached = cache.get(key)
    if isinstance(cached, int):
        return cached
    cost = client.count(model=model, system=system, messages=[PAD_MESSAGE]) - client.count(
        model=model, system=None, messages=[PAD_MESSAGE]
    )
    cost = max(cost, 0)
    cache.set(key, cost, _SYSTEM_CACHE_SECONDS)
    return cost


def _counted_events(session_id: uuid.UUID) -> list[Event]:
    """Every model-visible event of the session, folded or not, in seq order."""
    return list(
        Event.objects.filter(session_id=session_id)
        .exclude(type=EventType.LOCAL_SYSTEM_MESSAGE)
        .exclude(type=EventType.COMPACTION, content="")
        .order_by("seq")
        .only(
            "id",
            "seq",
            "type",
            "content",
            "name",
            "tool_call_id",
            "token_provenance",
            "exact_cumulative_count",
        )
    )


def count_session_exactly(*, session_id: Any, client: AnthropicCountClient | None = None) -> int:
    """Replace the local counts of the session's not-yet-exact events by the API's; returns
    how many changed. Raises `CountError` after storing whatever it counted before the error,
    so a retry continues where this call stopped."""
    session = Session.objects.get(pk=session_id)
    client = client or count_client()
    events = _counted_events(session.pk)
    if all(e.token_provenance == TokenProvenance.ANTHROPIC_API for e in events):
        return 0
    system_events = [e for e in events if e.type == EventType.SYSTEM_PROMPT]
    system = system_events[0].content if system_events else None
    counts: dict[uuid.UUID, tuple[int, int | None]] = {}
    try:
        system_cost = _system_cost(client, model=session.model, system=system) if system else 0
        for event in system_events:
            if event.token_provenance != TokenProvenance.ANTHROPIC_API:
                counts[event.pk] = (system_cost, None)
        previous = system_cost
        prefix: list[LedgerMessage] = []
        for event in events:
            if event.type == EventType.SYSTEM_PROMPT:
                continue
            prefix.append(LedgerMessage(event.type, event.content, event.name, event.tool_call_id))
            done = event.token_provenance == TokenProvenance.ANTHROPIC_API
            if done and event.exact_cumulative_count is not None:
                previous = event.exact_cumulative_count
                continue
            total = client.count(
                model=session.model, system=system, messages=to_anthropic_messages(prefix)
            )
            counts[event.pk] = (max(total - previous, 0), total)
            previous = total
    finally:
        changed = _apply(session_id=session.pk, counts=counts)
    return changed


def _apply(*, session_id: uuid.UUID, counts: dict[uuid.UUID, tuple[int, int | None]]) -> int:
    if not counts:
        return 0
    with transaction.atomic():
        session = Session.objects.select_for_update().get(pk=session_id)
        events = list(
            Event.objects.select_for_update()
            .filter(pk__in=list(counts))
            .exclude(token_provenance=TokenProvenance.ANTHROPIC_API)
        )
        active = set(
            Event.objects.active()
            .filter(pk__in=[e.pk for e in events])
            .values_list("pk", flat=True)
        )
        delta_active = delta_ledger = 0
        for event in events:
            exact, cumulative = counts[event.pk]
            delta = exact - event.token_count
            delta_ledger += delta
            # A cleared tool result is sent as its placeholder: its original count is not in
            # the active total, so the active total does not move.
            if event.pk in active and event.cleared_token_count is None:
                delta_active += delta
            event.token_count = exact
            event.exact_token_count = exact
            event.exact_cumulative_count = cumulative
            event.token_provenance = TokenProvenance.ANTHROPIC_API
        Event.objects.bulk_update(
            events,
            ["token_count", "exact_token_count", "exact_cumulative_count", "token_provenance"],
        )
        session.active_tokens = max(0, session.active_tokens + delta_active)
        session.ledger_tokens = max(0, session.ledger_tokens + delta_ledger)
        session.save(update_fields=["active_tokens", "ledger_tokens", "updated_at"])
        committed = session
        transaction.on_commit(lambda: token_counts_updated.send(sender=Session, session=committed))
    return len(events)
