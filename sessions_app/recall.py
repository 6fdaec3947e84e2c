"""Recall: original events of a session, folded ones included, rendered as messages within a
token budget (`POST /api/v1/sessions/{id}/recall`), and the `ledger_recall` tool that offers it
to a model."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from sessions_app.errors import InvalidInput
from sessions_app.models import Event, EventType, Session, is_model_visible
from sessions_app.search import parse_query, ranked_events
from sessions_app.search_index import index_scope
from sessions_app.selectors import render_messages

RECALL_TOOL_NAME = "ledger_recall"
RECALL_DEFAULT_TOKENS = 4000
RECALL_MAX_SEQS = 200
# Recall by query considers this many of the best-ranked hits.
RECALL_CANDIDATES = 50


@dataclass
class Recalled:
    messages: list[dict[str, Any]]
    system: str | None
    events: list[Event]
    token_count: int
    max_tokens: int
    omitted: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)


def _recallable(event: Event) -> bool:
    return is_model_visible(event.type, event.content) and not event.reverted


def _with_tool_partners(session: Session, events: Iterable[Event]) -> dict[int, list[Event]]:
    """For each event, the events that must travel with it: a TOOL_CALL and its results."""
    call_ids = {
        event.tool_call_id
        for event in events
        if event.type in (EventType.TOOL_CALL, EventType.TOOL_RESULT) and event.tool_call_id
    }
    partners: dict[str, list[Event]] = {}
    if call_ids:
        for event in Event.objects.filter(
            session=session,
            tool_call_id__in=call_ids,
            type__in=(EventType.TOOL_CALL, EventType.TOOL_RESULT),
        ).order_by("seq"):
            partners.setdefault(event.tool_call_id, []).append(event)
    units: dict[int, list[Event]] = {}
    for event in events:
        group = partners.get(event.tool_call_id) if event.tool_call_id else None
        units[event.seq] = group if group else [event]
    return units


def recall_budget(*, session: Session, max_tokens: int | None) -> int:
    """The budget a recall request (REST or MCP) gets: RECALL_DEFAULT_TOKENS, at most the
    session's contextLimit, when it names none; more than contextLimit is refused."""
    if max_tokens is None:
        return min(RECALL_DEFAULT_TOKENS, session.context_limit)
    if max_tokens > session.context_limit:
        raise InvalidInput(
            "maxTokens must not exceed the session's contextLimit",
            code="invalid_request",
            fields={"maxTokens": f"at most {session.context_limit}"},
        )
    return max_tokens


def recall(
    *,
    session: Session,
    text: str | None = None,
    seqs: Sequence[int] | None = None,
    max_tokens: int = RECALL_DEFAULT_TOKENS,
    fmt: str = "openai",
) -> Recalled:
    """Original events of `session` as messages ready to send, within `max_tokens`.

    Candidates are the RECALL_CANDIDATES best-ranked events matching `text`, or the events
    with the given `seqs`; they fill the budget newest first. Each candidate is taken with its tool partners
    (a TOOL_CALL and its TOOL_RESULTs are never split) if the whole unit still fits the
    budget; a candidate that does not fit is listed in `omitted`, and the next ones are tried.
    The chosen events are sent in seq order, with their original content (a cleared tool
    result's original, not its placeholder). Events never sent to a model
    (LOCAL_SYSTEM_MESSAGE, a trim's empty marker, a reverted run's summary) are not recalled.
    """
    missing: list[int] = []
    if text is not None:
        query = parse_query(text)
        index_scope(session_id=session.pk)
        ranked = (
            ranked_events(query, session_id=session.pk, owner_id=None, limit=RECALL_CANDIDATES)
            if query is not None
            else []
        )
        ids = [event.pk for event in ranked]
        # Every hit holds every word of the query; of the best-ranked ones, the newest win
        # the budget, as in /context's newest-first fill.
        candidates = sorted(Event.objects.filter(pk__in=ids), key=lambda event: -event.seq)
    else:
        wanted = list(dict.fromkeys(seqs or []))
        found = {e.seq: e for e in Event.objects.filter(session=session, seq__in=wanted)}
        missing = [seq for seq in wanted if seq not in found]
        candidates = sorted(found.values(), key=lambda event: -event.seq)
    candidates = [event for event in candidates if _recallable(event)]
    units = _with_tool_partners(session, candidates)

    chosen: dict[int, Event] = {}
    used = 0
    omitted: list[int] = []
    for event in candidates:
        unit = [member for member in units[event.seq] if member.seq not in chosen]
        cost = sum(member.token_count for member in unit)
        if used + cost > max_tokens:
            omitted.append(event.seq)
            continue
        used += cost
        for member in unit:
            chosen[member.seq] = member
    ordered = [chosen[seq] for seq in sorted(chosen)]
    originals = []
    for event in ordered:
        # Recall returns what was recorded: a copy without clear_tool_results' placeholder.
        original = copy.copy(event)
        original.cleared_content = None
        originals.append(original)
    messages, system = render_messages(originals, fmt=fmt)
    return Recalled(
        messages=messages,
        system=system,
        events=ordered,
        token_count=used,
        max_tokens=max_tokens,
        omitted=omitted,
        missing=missing,
    )


def session_has_recallable(*, session: Session) -> bool:
    """Whether the session holds originals the active context does not: events folded by a
    compaction or tool results cleared to a placeholder."""
    return (
        Event.objects.filter(session=session)
        .filter(Q(compacted_by__isnull=False) | Q(cleared_content__isnull=False))
        .exists()
    )


_RECALL_DESCRIPTION = (
    "Fetch original messages of this conversation that were compacted out of your context "
    "(folded into the summary, or tool results replaced by a placeholder). Give `query` "
    "(keywords, identifiers, file paths, error codes) to search them, or `seqs` to fetch the "
    "events a summary line cites, e.g. [#812] or [#812-#840] → [812, ..., 840]."
)
_RECALL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Words, identifiers or paths to search for in the earlier messages.",
        },
        "seqs": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "maxItems": RECALL_MAX_SEQS,
            "description": "Sequence numbers of the events to fetch, as cited in the summary.",
        },
        "maxTokens": {
            "type": "integer",
            "minimum": 1,
            "description": f"Token budget for the recalled messages (default {RECALL_DEFAULT_TOKENS}).",
        },
    },
}


def recall_tool(*, fmt: str = "openai") -> dict[str, Any]:
    """The `ledger_recall` function-tool definition in a provider's format. Its arguments are
    the body of `POST /api/v1/sessions/{id}/recall`."""
    if fmt == "anthropic":
        return {
            "name": RECALL_TOOL_NAME,
            "description": _RECALL_DESCRIPTION,
            "input_schema": copy.deepcopy(_RECALL_PARAMETERS),
        }
    return {
        "type": "function",
        "function": {
            "name": RECALL_TOOL_NAME,
            "description": _RECALL_DESCRIPTION,
            "parameters": copy.deepcopy(_RECALL_PARAMETERS),
        },
    }
