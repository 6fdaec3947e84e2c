"""The MCP tools: a name, a description written for a model, a JSON schema, and a sync handler.

Each handler is thin like a REST view: it validates the arguments (with REST's own
serializers where REST has them, so errors read the same), calls the service or selector the
REST endpoint calls, and serialises the result compactly: a model reads it inside its own
context window, so nothing is returned whole by default (no session's full history, no
lists of UUIDs a model cannot use).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from rest_framework import serializers

from compaction_app import services as compaction
from compaction_app.api.serializers import (
    CompactionRequestSerializer,
    dry_run_to_dict,
    run_to_dict,
)
from compaction_app.mcp import selectors
from compaction_app.models import Trigger
from sessions_app import recall, scope, search
from sessions_app import selectors as ledger
from sessions_app import services as ledger_services
from sessions_app.api.search_views import RecallInSerializer
from sessions_app.errors import InvalidInput
from sessions_app.heavy import heavy_slot
from sessions_app.models import Session
from sessions_app.session_settings import SessionSettings
from sessions_app.threads import threads_by_session

User = AbstractBaseUser | AnonymousUser
Handler = Callable[[User, Mapping[str, Any]], dict[str, Any]]

SESSIONS_DEFAULT = 10
SESSIONS_MAX = 100
SEARCH_DEFAULT = 10
# Search snippets are ~240 characters each: 50 of them is already ~4k tokens.
SEARCH_MAX = 50

_SESSION_ARG: dict[str, Any] = {
    "type": "string",
    "maxLength": 200,
    "description": "The session: its id, or the client key your gateway requests send as "
    "X-Ledger-Session. Omit it for your most recently active session.",
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    schema: dict[str, Any]
    handler: Handler
    read_only: bool = True


# --- argument validation ---------------------------------------------------------------------


class _SessionArg(serializers.Serializer):
    session = serializers.CharField(required=False, max_length=200, allow_blank=True)


class _UsageArgs(_SessionArg):
    thread = serializers.CharField(required=False, max_length=200, min_length=1)


class _SessionsArgs(serializers.Serializer):
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=SESSIONS_MAX, default=SESSIONS_DEFAULT
    )


class _SearchArgs(_SessionArg):
    query = serializers.CharField(max_length=search.MAX_QUERY_CHARS)
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=SEARCH_MAX, default=SEARCH_DEFAULT
    )


class _RecallArgs(_SessionArg, RecallInSerializer):
    pass


class _CompactArgs(_SessionArg, CompactionRequestSerializer):
    pass


class _PinArgs(_SessionArg):
    # Bounded like the seq column, so a huge number is a 400, not a database overflow.
    seq = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
    pinned = serializers.BooleanField(required=False, default=True)


def _valid(serializer: type[serializers.Serializer], arguments: Mapping[str, Any]) -> Any:
    """The validated arguments; an argument the tool does not take is refused, not ignored (a
    model that misspells one should learn so)."""
    unknown = sorted(set(arguments) - set(serializer().fields))
    if unknown:
        raise InvalidInput(
            f"unknown argument: {unknown[0]}",
            code="invalid_request",
            fields={name: "not an argument of this tool" for name in unknown},
        )
    body = serializer(data=dict(arguments))
    body.is_valid(raise_exception=True)
    return body.validated_data


def _session(user: User, data: Mapping[str, Any]) -> Session:
    return selectors.session_named(user=user, name=data.get("session"))


def _session_ref(session: Session) -> dict[str, Any]:
    return {"id": str(session.pk), "title": session.title, "model": session.model}


# --- handlers --------------------------------------------------------------------------------


def ledger_sessions(user: User, arguments: Mapping[str, Any]) -> dict[str, Any]:
    data = _valid(_SessionsArgs, arguments)
    rows = selectors.recent_sessions(user=user, limit=data["limit"])
    staff = bool(getattr(user, "is_staff", False))
    out = []
    threads = threads_by_session(session_ids=[s.pk for s in rows])
    for session in rows:
        # The main thread's context figures, as /usage and the dashboard give them.
        context = scope.context_figures(session=session, threads=threads.get(session.pk, []))
        row: dict[str, Any] = {
            **_session_ref(session),
            "clientKey": session.client_key,
            "percentUsed": context.percent_used,
            "contextTokens": context.context_tokens,
            "contextLimit": context.context_limit,
            "events": session.event_count,
            "updatedAt": session.updated_at.isoformat(),
        }
        if staff:
            row["owner"] = session.owner.get_username()
        out.append(row)
    return {"sessions": out}


def ledger_usage(user: User, arguments: Mapping[str, Any]) -> dict[str, Any]:
    data = _valid(_UsageArgs, arguments)
    session = _session(user, data)
    settings = SessionSettings.of(session.settings)
    # REST /usage's document: the thread's context figures (the main thread's by default),
    # the whole session's bill.
    usage = ledger.usage_for_session(session=session, thread=data.get("thread"))
    return {
        "session": _session_ref(session),
        **usage,
        "thresholds": {
            "compact": settings.compact_threshold,
            "hardLimit": settings.hard_limit_threshold,
        },
    }


def ledger_search(user: User, arguments: Mapping[str, Any]) -> dict[str, Any]:
    data = _valid(_SearchArgs, arguments)
    session = _session(user, data)
    text = search.check_query(data["query"])
    hits = search.search_session(session=session, text=text, limit=data["limit"])
    return {
        "session": _session_ref(session),
        "results": [
            {
                "seq": hit.event.seq,
                "type": hit.event.type,
                "name": hit.event.name,
                "folded": hit.folded,
                # A model reads plain text, the matches in **bold**.
                "snippet": hit.snippet.marked("**", "**"),
            }
            for hit in hits
        ],
    }


def ledger_recall(user: User, arguments: Mapping[str, Any]) -> dict[str, Any]:
    data = _valid(_RecallArgs, arguments)
    session = _session(user, data)
    # As POST /sessions/{id}/recall, under the same per-user limit (issue 42, row 3).
    with heavy_slot(user_id=user.pk):
        result = recall.recall(
            session=session,
            text=data.get("query"),
            seqs=data.get("seqs"),
            max_tokens=recall.recall_budget(session=session, max_tokens=data.get("maxTokens")),
            fmt=data["format"],
        )
    return {
        "session": _session_ref(session),
        # The originals as recorded (a cleared tool result's own text, not its placeholder).
        "events": [
            {
                "seq": event.seq,
                "type": event.type,
                "name": event.name,
                "toolCallId": event.tool_call_id,
                "folded": event.compacted_by_id is not None,
                "content": event.content,
            }
            for event in result.events
        ],
        "tokenCount": result.token_count,
        "maxTokens": result.max_tokens,
        "omitted": result.omitted,
        "missing": result.missing,
    }


def ledger_compact(user: User, arguments: Mapping[str, Any]) -> dict[str, Any]:
    data = _valid(_CompactArgs, arguments)
    session = _session(user, data)
    if data.get("dryRun"):
        # As REST's dry run, under the same per-user limit (issue 42, row 3).
        with heavy_slot(user_id=user.pk):
            dry = compaction.compaction_plan(
                session=session,
                strategy=data.get("strategy"),
                summarizer=data.get("summarizer"),
                target_ratio=data.get("targetRatio"),
                project=True,
            )
        answer = dry_run_to_dict(dry)
        # The tool answers with counts where REST lists the ids (docs/mcp.md).
        for key in ("eventsToFold", "toolResultsToClear"):
            answer[key] = len(answer[key])
        return {"session": _session_ref(session), **answer}
    run = compaction.compaction_request(
        session=session,
        user=user,
        trigger=Trigger.MANUAL,
        strategy=data.get("strategy"),
        summarizer=data.get("summarizer"),
        target_ratio=data.get("targetRatio"),
    )
    return {"session": _session_ref(session), "compaction": run_to_dict(run)}


def ledger_pin(user: User, arguments: Mapping[str, Any]) -> dict[str, Any]:
    data = _valid(_PinArgs, arguments)
    session = _session(user, data)
    event = selectors.event_at(session=session, seq=data["seq"])
    event = ledger_services.event_set_pinned(event=event, pinned=data["pinned"])
    return {
        "session": _session_ref(session),
        "seq": event.seq,
        "type": event.type,
        "pinned": event.pinned,
        "folded": event.compacted_by_id is not None,
    }


# --- the tool list ---------------------------------------------------------------------------


def _schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="ledger_sessions",
        title="List ledger sessions",
        description=(
            "List the conversation sessions the Context Ledger records for you, most recently "
            "active first, each with its id, title, model, gateway client key, how full its "
            "context window is (percentUsed, contextTokens of contextLimit) and its event "
            "count. Use it to find the session to pass to the other ledger tools; they default "
            "to your most recently active session."
        ),
        schema=_schema(
            {
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": SESSIONS_MAX,
                    "default": SESSIONS_DEFAULT,
                    "description": "How many sessions to list.",
                }
            }
        ),
        handler=ledger_sessions,
    ),
    ToolSpec(
        name="ledger_usage",
        title="Context usage",
        description=(
            "How full a session's context window is right now: percentUsed, contextTokens of "
            "contextLimit, the compact and hard-limit thresholds (nearLimit, atLimit), the "
            "provider-reported token totals, the last compaction (tokens before and after) "
            "and cost where the model has a price. The context figures are one thread's (the "
            "main thread's unless `thread` names another); the tokens, cost and calls are "
            "the whole session's. Call it before a long step to decide whether to ask for a "
            "compaction first."
        ),
        schema=_schema(
            {
                "session": _SESSION_ARG,
                "thread": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200,
                    "description": "A thread's key (gateway sessions): whose context figures.",
                },
            }
        ),
        handler=ledger_usage,
    ),
    ToolSpec(
        name="ledger_search",
        title="Search the session's history",
        description=(
            "Full-text search over every event of a session, including the ones a compaction "
            "folded out of your context. Give words, identifiers, file paths or error codes; "
            "every word must match. Returns the best matches with their seq (sequence number), "
            "type, whether they were folded, and a short snippet with the matches in **bold**. "
            "Then call ledger_recall with those seqs for the exact original text."
        ),
        schema=_schema(
            {
                "session": _SESSION_ARG,
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": search.MAX_QUERY_CHARS,
                    "description": "Words, identifiers or paths to look for.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": SEARCH_MAX,
                    "default": SEARCH_DEFAULT,
                    "description": "How many matches to return.",
                },
            },
            ["query"],
        ),
        handler=ledger_search,
    ),
    ToolSpec(
        name="ledger_recall",
        title="Recall original events",
        description=(
            "Fetch the exact original text of earlier events, including those a compaction "
            "folded into the summary or a tool result replaced by a placeholder. Give `seqs` "
            "(from ledger_search, or as a summary cites them: [#812] or [#812-#840] → 812 … "
            "840) or a `query` to search for. The events come back in order within a token "
            "budget (maxTokens, default 4000); a tool call and its result always come "
            "together, and what did not fit is listed in `omitted`."
        ),
        schema=_schema(
            {
                "session": _SESSION_ARG,
                "seqs": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "minItems": 1,
                    "maxItems": recall.RECALL_MAX_SEQS,
                    "description": "Sequence numbers of the events to fetch.",
                },
                "query": {
                    "type": "string",
                    "maxLength": search.MAX_QUERY_CHARS,
                    "description": "Search instead of seqs: words, identifiers or paths.",
                },
                "maxTokens": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Token budget for the recalled events (default 4000, at "
                    "most the session's context limit).",
                },
            }
        ),
        handler=ledger_recall,
    ),
    ToolSpec(
        name="ledger_compact",
        title="Compact the session",
        description=(
            "Ask the ledger to compact a session's context: older events are folded into a "
            "running summary (strategy `summarize`, the default), trimmed (`trim`), or old tool "
            "results are replaced by placeholders (`clear_tool_results`). Nothing is deleted: "
            "ledger_recall still returns every original. With dryRun true nothing changes and "
            "you get the plan (events to fold, tokens before and projected after); otherwise "
            "the compaction is queued and returned as pending. Only one runs at a time per "
            "session."
        ),
        schema=_schema(
            {
                "session": _SESSION_ARG,
                "strategy": {
                    "type": "string",
                    "enum": ["summarize", "trim", "clear_tool_results"],
                    "description": "Default: the session's own setting.",
                },
                "summarizer": {
                    "type": "string",
                    "enum": ["local", "openai", "anthropic"],
                    "description": "Who writes the summary. Default: the session's setting.",
                },
                "targetRatio": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 1,
                    "description": "trim: fill to aim for, as a fraction of the context limit.",
                },
                "dryRun": {
                    "type": "boolean",
                    "default": False,
                    "description": "Only plan; change nothing.",
                },
            }
        ),
        handler=ledger_compact,
        read_only=False,
    ),
    ToolSpec(
        name="ledger_pin",
        title="Pin or unpin an event",
        description=(
            "Pin an event (by its seq) so no compaction ever folds it out of the context — for "
            "a requirement, a decision or an error you must keep seeing — or unpin it with "
            "pinned false. Pinning does not bring back an event that is already folded; use "
            "ledger_recall for that."
        ),
        schema=_schema(
            {
                "session": _SESSION_ARG,
                "seq": {"type": "integer", "minimum": 1, "description": "The event's seq."},
                "pinned": {"type": "boolean", "default": True},
            },
            ["seq"],
        ),
        handler=ledger_pin,
        read_only=False,
    ),
)

TOOLS_BY_NAME: dict[str, ToolSpec] = {tool.name: tool for tool in TOOLS}
