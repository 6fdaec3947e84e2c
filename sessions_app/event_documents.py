"""An event as the API shows it (camelCase, JSON-ready), built without the REST framework:
the API's views answer with it, and the memory_flush webhook task sends the same documents
without depending on the REST layer."""

from __future__ import annotations

from typing import Any

from sessions_app.models import Event
from sessions_app.storable import load_stored


def event_out(events: list[Event], *, content_max_chars: int | None = None) -> list[dict[str, Any]]:
    """sessions_app.api.serializers.EventOutSerializer's output, built by hand: a bulk append
    answers thousands of events and DRF's per-field machinery was ~15% of its time.
    tests/test_api_serializers.py keeps the two identical.

    `content_max_chars`: an event whose stored content is longer is shown with `content`
    null (an append's answer: sessions_app/api/serializers.py, APPEND_ANSWER_MAX_CONTENT_CHARS)."""
    return [_event_dict(event, content_max_chars) for event in events]


def iso_datetime(value: Any) -> str:
    """A datetime as DRF renders it: ISO 8601, UTC as 'Z'."""
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _content(event: Event, max_chars: int | None) -> Any:
    if max_chars is not None and len(event.content) > max_chars:
        return None
    return load_stored(event.content) if event.content_is_json else event.content


def _event_dict(event: Event, content_max_chars: int | None = None) -> dict[str, Any]:
    usage = None
    if not (
        event.prompt_tokens is None
        and event.completion_tokens is None
        and event.total_tokens is None
    ):
        usage = {
            "promptTokens": event.prompt_tokens,
            "completionTokens": event.completion_tokens,
            "totalTokens": event.total_tokens,
            **cache_usage(event),
        }
    return {
        "id": str(event.id),
        "sessionId": str(event.session_id),
        "seq": event.seq,
        "type": event.type,
        "role": event.role,
        "content": _content(event, content_max_chars),
        "name": event.name,
        "toolCallId": event.tool_call_id,
        "tokenCount": event.token_count,
        "tokenProvenance": event.token_provenance,
        "tokenUsage": usage,
        "pinned": event.pinned,
        "metadata": event.metadata,
        "compactedBy": str(event.compacted_by_id) if event.compacted_by_id else None,
        "cleared": event.cleared_content is not None,
        "reverted": event.reverted,
        "createdAt": iso_datetime(event.created_at),
    }


def cache_usage(event: Event) -> dict[str, int]:
    """An event's cache figures for its tokenUsage, only those the provider reported."""
    found = {}
    if event.cached_input_tokens is not None:
        found["cachedInputTokens"] = event.cached_input_tokens
    if event.cache_write_tokens is not None:
        found["cacheWriteTokens"] = event.cache_write_tokens
    return found
