"""Input validation and output shapes of the REST API (camelCase on the wire)."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from sessions_app import pricing

# The plain event document lives outside the REST layer so tasks (the memory_flush webhook)
# send the same shape; the views answer with it through this module.
from sessions_app.event_documents import cache_usage
from sessions_app.event_documents import event_out as event_out
from sessions_app.models import Event, EventType, Session
from sessions_app.services import MAX_REPORTED_TOKENS, EventInput, TokenUsage
from sessions_app.storable import load_stored

CLIENT_EVENT_TYPES = [t.value for t in EventType if t != EventType.COMPACTION]


class StrictIntegerField(serializers.IntegerField):
    """An integer that must arrive as a JSON integer: no "5", no 5.5, no true."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictUUIDField(serializers.UUIDField):
    """A UUID that must arrive as a JSON string (false or 0 is not "no id")."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """Text kept exactly as sent (no trimming); the NUL and surrogate checks are the
    services' job so every caller gets them."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        kwargs.setdefault("allow_blank", True)
        super().__init__(**kwargs)
        # The service reports these with a precise error code.
        self.validators = [
            v
            for v in self.validators
            if type(v).__name__
            not in {"ProhibitNullCharactersValidator", "ProhibitSurrogateCharactersValidator"}
        ]

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return data


@extend_schema_field(OpenApiTypes.ANY)
class ContentField(serializers.Field):
    """Message content: a string, or structured parts (a JSON array or object)."""

    default_error_messages = {"invalid": "Must be a string, an array or an object."}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str | list | dict):
            return data
        self.fail("invalid")

    def to_representation(self, value: Any) -> Any:
        return value


class TokenUsageSerializer(serializers.Serializer):
    promptTokens = StrictIntegerField(
        min_value=0, max_value=MAX_REPORTED_TOKENS, required=False, allow_null=True
    )
    completionTokens = StrictIntegerField(
        min_value=0, max_value=MAX_REPORTED_TOKENS, required=False, allow_null=True
    )
    totalTokens = StrictIntegerField(
        min_value=0,
        max_value=MAX_REPORTED_TOKENS,
        required=False,
        allow_null=True,
        help_text="Left out (or null) beside promptTokens or completionTokens: their sum "
        "(stored and counted so); that sum must then be within the same bound.",
    )
    cachedInputTokens = StrictIntegerField(
        min_value=0,
        max_value=MAX_REPORTED_TOKENS,
        required=False,
        allow_null=True,
        help_text="Part of promptTokens the provider read from its prompt cache "
        "(with cacheWriteTokens, at most promptTokens: else 400).",
    )
    cacheWriteTokens = StrictIntegerField(
        min_value=0,
        max_value=MAX_REPORTED_TOKENS,
        required=False,
        allow_null=True,
        help_text="Part of promptTokens the provider wrote to its prompt cache.",
    )


class EventInSerializer(serializers.Serializer):
    id = StrictUUIDField(required=False)
    type = serializers.ChoiceField(choices=CLIENT_EVENT_TYPES)
    content = ContentField()
    name = StrictCharField(required=False, max_length=200)
    toolCallId = StrictCharField(required=False, max_length=200)
    tokenUsage = TokenUsageSerializer(required=False, allow_null=True)
    pinned = StrictBooleanField(required=False)
    metadata = serializers.DictField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs["type"]
        if kind == EventType.TOOL_CALL and (not attrs.get("name") or not attrs.get("toolCallId")):
            raise serializers.ValidationError(
                {"toolCallId": "TOOL_CALL needs name and toolCallId."}
            )
        if kind == EventType.TOOL_RESULT and not attrs.get("toolCallId"):
            raise serializers.ValidationError({"toolCallId": "TOOL_RESULT needs toolCallId."})
        if kind == EventType.CONTEXT_REFRESH and not (
            isinstance(attrs["content"], str) and attrs["content"].startswith("[CONTEXT REFRESH]")
        ):
            raise serializers.ValidationError(
                {"content": "CONTEXT_REFRESH content starts with [CONTEXT REFRESH]."}
            )
        return attrs


def to_event_input(data: dict[str, Any]) -> EventInput:
    usage = data.get("tokenUsage")
    return EventInput(
        id=data.get("id"),
        type=data["type"],
        content=data["content"],
        name=data.get("name", ""),
        tool_call_id=data.get("toolCallId", ""),
        token_usage=TokenUsage(
            prompt_tokens=usage.get("promptTokens"),
            completion_tokens=usage.get("completionTokens"),
            total_tokens=usage.get("totalTokens"),
            cached_input_tokens=usage.get("cachedInputTokens"),
            cache_write_tokens=usage.get("cacheWriteTokens"),
        )
        if usage
        else None,
        pinned=data.get("pinned", False),
        metadata=data.get("metadata", {}),
    )


class EventPatchSerializer(serializers.Serializer):
    pinned = StrictBooleanField()


# An append's answer echoes each stored event, but not a content longer than this (characters
# of its stored text): it shows such a content as null, and GET .../events/{eventId} has it.
# Echoing a content renders it twice more (JSON text, then bytes) on top of the parsed copy,
# and the server then buffers it again while sending: a 30 MB event cost 4x its size in the
# answer alone (issue 22, row 14). One of this size costs about 768 KB to answer.
APPEND_ANSWER_MAX_CONTENT_CHARS = 1 << 18


class EventOutSerializer(serializers.ModelSerializer):
    sessionId = serializers.UUIDField(source="session_id", read_only=True)
    role = serializers.CharField(read_only=True)
    content = serializers.SerializerMethodField(
        help_text="A string, or structured parts (an array or an object). In an append's "
        f"answer null for a content longer than {APPEND_ANSWER_MAX_CONTENT_CHARS:,} "
        "characters (GET the event to read it)."
    )
    toolCallId = serializers.CharField(source="tool_call_id", read_only=True)
    tokenCount = serializers.IntegerField(source="token_count", read_only=True)
    tokenProvenance = serializers.CharField(source="token_provenance", read_only=True)
    tokenUsage = serializers.SerializerMethodField()
    compactedBy = serializers.UUIDField(source="compacted_by_id", read_only=True, allow_null=True)
    cleared = serializers.SerializerMethodField()
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Event
        fields = [
            "id",
            "sessionId",
            "seq",
            "type",
            "role",
            "content",
            "name",
            "toolCallId",
            "tokenCount",
            "tokenProvenance",
            "tokenUsage",
            "pinned",
            "metadata",
            "compactedBy",
            "cleared",
            "reverted",
            "createdAt",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.ANY)
    def get_content(self, event: Event) -> Any:
        # The original content; a cleared tool result's placeholder is what /context sends.
        return load_stored(event.content) if event.content_is_json else event.content

    @extend_schema_field(TokenUsageSerializer(allow_null=True))
    def get_tokenUsage(self, event: Event) -> dict[str, int | None] | None:
        if (
            event.prompt_tokens is None
            and event.completion_tokens is None
            and event.total_tokens is None
        ):
            return None
        return {
            "promptTokens": event.prompt_tokens,
            "completionTokens": event.completion_tokens,
            "totalTokens": event.total_tokens,
            **cache_usage(event),
        }

    def get_cleared(self, event: Event) -> bool:
        return event.cleared_content is not None


class EventPageSerializer(serializers.Serializer):
    """A cursor page of events: pass nextAfter as ?after= for the next one (null at the end)."""

    results = EventOutSerializer(many=True)
    nextAfter = serializers.IntegerField(allow_null=True)


class SessionCreateSerializer(serializers.Serializer):
    model = StrictCharField(max_length=200, allow_blank=False)
    title = StrictCharField(required=False, max_length=200)
    contextLimit = StrictIntegerField(required=False, allow_null=True)
    systemPrompt = StrictCharField(required=False, allow_null=True)
    settings = serializers.JSONField(required=False)


class SessionPatchSerializer(serializers.Serializer):
    title = StrictCharField(required=False, max_length=200)
    contextLimit = StrictIntegerField(required=False)
    settings = serializers.JSONField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = (
            sorted(set(self.initial_data) - set(self.fields))
            if isinstance(self.initial_data, dict)
            else []
        )
        if unknown:
            raise serializers.ValidationError(
                {key: "This field cannot be changed." for key in unknown}
            )
        return attrs


class SessionOutSerializer(serializers.ModelSerializer):
    contextLimit = serializers.IntegerField(source="context_limit", read_only=True)
    contextTokens = serializers.IntegerField(source="context_tokens", read_only=True)
    eventCount = serializers.IntegerField(source="event_count", read_only=True)
    owner = serializers.CharField(source="owner.get_username", read_only=True)
    lastCompaction = serializers.JSONField(source="last_compaction", read_only=True)
    compactionNetUsd = serializers.SerializerMethodField(
        help_text="What the session's compactions saved (negative: cost), measured on the "
        "gateway calls after each (docs/costs.md)."
    )
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    updatedAt = serializers.DateTimeField(source="updated_at", read_only=True)

    def get_compactionNetUsd(self, obj: Session) -> float:  # noqa: N802
        return pricing.usd(obj.compaction_net_nano_usd)

    class Meta:
        model = Session
        fields = [
            "id",
            "title",
            "model",
            "encoding",
            "contextLimit",
            "contextTokens",
            "eventCount",
            "settings",
            "owner",
            "lastCompaction",
            "compactionNetUsd",
            "createdAt",
            "updatedAt",
        ]
        read_only_fields = fields


class UsageSerializer(serializers.Serializer):
    totalPromptTokens = serializers.IntegerField()
    totalCompletionTokens = serializers.IntegerField()
    totalTokens = serializers.IntegerField()
    # Events that carried provider usage (prompt/completion tokens), not all stored events:
    # that is the session's eventCount.
    reportedEventCount = serializers.IntegerField()
    contextTokens = serializers.IntegerField()
    contextLimit = serializers.IntegerField()
    percentUsed = serializers.FloatField()
    nearLimit = serializers.BooleanField()
    atLimit = serializers.BooleanField()
    model = serializers.CharField()
    encoding = serializers.CharField()
    exact = serializers.BooleanField()
    cumulativeTokens = serializers.IntegerField()
    refreshThresholdTokens = serializers.IntegerField()
    lastCompaction = serializers.JSONField(allow_null=True)
    lastProviderPromptTokens = serializers.IntegerField(allow_null=True)
    countDriftPercent = serializers.FloatField(allow_null=True)
    thread = serializers.CharField(
        required=False,
        help_text="The thread the context figures are for (gateway sessions only; the main "
        "thread unless ?thread= names another).",
    )
    scope = inline_serializer(
        "UsageScope",
        {
            "context": serializers.CharField(help_text='"thread": the context figures\' scope.'),
            "thread": serializers.CharField(
                allow_blank=True, help_text='Their thread ("": the whole ledger).'
            ),
            "bill": serializers.CharField(help_text='"session": every thread, every call.'),
        },
    )
    calls = serializers.IntegerField(
        help_text="Gateway calls the provider answered (retries included): the bill counts each."
    )
    failedCalls = serializers.IntegerField(
        help_text="Gateway calls the provider did not answer (refused, failed): billed nothing."
    )
    threadBill = inline_serializer(
        "ThreadBill",
        {
            "thread": serializers.CharField(),
            "calls": serializers.IntegerField(),
            "promptTokens": serializers.IntegerField(),
            "completionTokens": serializers.IntegerField(),
            "totalTokens": serializers.IntegerField(),
        },
        required=False,
        help_text="With ?thread=: that thread's share of the session's bill.",
    )
    cachedInputTokens = serializers.IntegerField(
        help_text="Provider-reported cache reads, summed (part of totalPromptTokens)."
    )
    cacheWriteTokens = serializers.IntegerField(
        help_text="Provider-reported cache writes, summed (part of totalPromptTokens)."
    )
    cacheHitRate = serializers.FloatField(
        allow_null=True,
        help_text="cachedInputTokens ÷ totalPromptTokens (0–1); null before any reported call.",
    )
    costUsd = serializers.FloatField(
        help_text="Every reported call priced with genai-prices (cache reads and writes at "
        "their own rates): the known sum; calls whose model has no price add nothing "
        "(unpricedCalls counts them)."
    )
    unpricedCalls = serializers.IntegerField(
        help_text="Calls whose model has no price: what costUsd leaves out."
    )
    costUnknownReason = serializers.CharField(
        allow_null=True, help_text='"1 call with no price (…)" when unpricedCalls > 0.'
    )
    savedTokens = serializers.IntegerField(
        help_text="Per forwarded call, the client's request minus what the gateway forwarded."
    )
    savedUsd = serializers.FloatField(
        help_text="savedTokens priced at each call's uncached input rate."
    )
    compactionNetUsd = serializers.FloatField(
        help_text="What the session's compactions saved (negative: cost), measured on the "
        "gateway calls after each."
    )


class ContextSerializer(serializers.Serializer):
    messages = serializers.ListField(child=serializers.JSONField())
    system = serializers.CharField(required=False, allow_null=True)
    tokenCount = serializers.IntegerField()
    limit = serializers.IntegerField()
    pruned = serializers.BooleanField()
    summary = serializers.CharField(allow_null=True)
    compactionRecommended = serializers.BooleanField(
        help_text="The context is at or past the compact threshold: compact (POST /context "
        "or /compact) instead of sending pruned views."
    )
    compaction = serializers.JSONField(
        required=False, help_text="The run POST /context made first, at the hard limit."
    )
    tools = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        help_text="[ledger_recall] once the session has folded or cleared events.",
    )


class TokenCountInSerializer(serializers.Serializer):
    model = StrictCharField(required=False, allow_blank=False)
    encoding = serializers.ChoiceField(choices=["cl100k_base", "o200k_base"], required=False)
    text = StrictCharField(required=False)
    messages = serializers.ListField(child=serializers.DictField(), required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("model" in attrs) == ("encoding" in attrs):
            raise serializers.ValidationError({"model": "Give exactly one of model or encoding."})
        if ("text" in attrs) == ("messages" in attrs):
            raise serializers.ValidationError({"text": "Give exactly one of text or messages."})
        for index, message in enumerate(attrs.get("messages", [])):
            if not isinstance(message.get("role"), str) or "content" not in message:
                raise serializers.ValidationError(
                    {f"messages[{index}]": "Needs a string role and a content."}
                )
            if message["content"] is not None and not isinstance(
                message["content"], str | list | dict
            ):
                raise serializers.ValidationError(
                    {f"messages[{index}].content": "Must be text or structured parts."}
                )
        return attrs


class TokenCountOutSerializer(serializers.Serializer):
    tokens = serializers.IntegerField()
    encoding = serializers.CharField()
    exact = serializers.BooleanField()


class ModelOutSerializer(serializers.Serializer):
    model = serializers.CharField()
    contextLimit = serializers.IntegerField()
    encoding = serializers.CharField()


_USAGE_KEYS = frozenset({"promptTokens", "completionTokens", "totalTokens"})
_CLIENT_TYPES = frozenset(CLIENT_EVENT_TYPES)


def _plainly_valid(item: Any) -> bool:
    """True only for an event that EventInSerializer certainly accepts unchanged (text content,
    well-typed optional fields). Anything else goes through the serializer, which stays the one
    source of validation errors."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    content = item.get("content")
    if not isinstance(kind, str) or kind not in _CLIENT_TYPES or not isinstance(content, str):
        return False
    for key in ("name", "toolCallId"):
        value = item.get(key, "")
        if not isinstance(value, str) or len(value) > 200:
            return False
    if "id" in item:
        if not isinstance(item["id"], str):
            return False
        try:
            uuid.UUID(hex=item["id"])
        except ValueError:
            return False
    if "pinned" in item and not isinstance(item["pinned"], bool):
        return False
    if "metadata" in item and not isinstance(item["metadata"], dict):
        return False
    usage = item.get("tokenUsage")
    if usage is not None:
        if not isinstance(usage, dict) or not set(usage) <= _USAGE_KEYS:
            return False
        for value in usage.values():
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= MAX_REPORTED_TOKENS
            ):
                return False
    if kind == EventType.TOOL_CALL and not (item.get("name") and item.get("toolCallId")):
        return False
    if kind == EventType.TOOL_RESULT and not item.get("toolCallId"):
        return False
    return not (kind == EventType.CONTEXT_REFRESH and not content.startswith("[CONTEXT REFRESH]"))


def parse_events(data: Any, *, single: bool) -> list[EventInput]:
    """Validate an event body. Plainly valid bulk input (the common case: thousands of text
    events) skips DRF's per-field work; everything else, and every error, goes through
    EventInSerializer."""
    items = [data] if single else data
    if all(_plainly_valid(item) for item in items):
        return [_fast_input(item) for item in items]
    body = EventInSerializer(data=data) if single else EventInSerializer(data=items, many=True)
    body.is_valid(raise_exception=True)
    validated = [body.validated_data] if single else body.validated_data
    return [to_event_input(item) for item in validated]


def _fast_input(item: dict[str, Any]) -> EventInput:
    # The same shape the serializer validates into, but for the id's parsing.
    return to_event_input({**item, "id": uuid.UUID(hex=item["id"])} if "id" in item else item)


class ThreadOutSerializer(serializers.Serializer):
    """One writer's conversation inside a session (see docs/fitting.md)."""

    key = serializers.CharField()
    main = serializers.BooleanField()
    named = serializers.BooleanField()
    calls = serializers.IntegerField()
    messages = serializers.IntegerField(help_text="Messages in its history as last seen.")
    contextTokens = serializers.IntegerField(help_text="What its last call forwarded.")
    lastFit = serializers.CharField(help_text="as_sent, fitted, compacted or pruned.")
    promptTokens = serializers.IntegerField()
    completionTokens = serializers.IntegerField()
    lastError = serializers.CharField(help_text="The last bookkeeping failure (the call went on).")
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()


class ThreadPageSerializer(serializers.Serializer):
    results = ThreadOutSerializer(many=True)


def threads_out(threads: list[Any]) -> list[dict[str, Any]]:
    """Threads as the API shows them, the first one being the session's main thread."""
    return [
        {
            "key": thread.key,
            "main": number == 0,
            "named": thread.named,
            "calls": thread.calls,
            "messages": thread.length,
            "contextTokens": thread.context_tokens,
            "lastFit": thread.last_fit,
            "promptTokens": thread.prompt_tokens,
            "completionTokens": thread.completion_tokens,
            "lastError": thread.last_error,
            "createdAt": thread.created_at,
            "updatedAt": thread.updated_at,
        }
        for number, thread in enumerate(threads)
    ]
