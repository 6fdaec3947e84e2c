"""OpenAPI documentation shared by the API's views: the error body and its responses, and the
page envelopes. tests/api/test_openapi_schema.py checks real responses against the result."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """Every error: a code, a text, and per code some extras (documented in docs/decisions.md)."""

    error = serializers.CharField(help_text="Machine-readable code, e.g. invalid_request.")
    detail = serializers.CharField(help_text="Human-readable explanation.")
    # The wire name; the metaclass takes declared fields off the class, so `.fields` still works.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.CharField(),
        required=False,
        help_text="Validation errors: field path (e.g. [2].content) → problem.",
    )
    limit = serializers.IntegerField(
        required=False, help_text="The bound that was passed (413, nesting_too_deep, 422)."
    )
    retryAfter = serializers.IntegerField(required=False, help_text="Seconds to wait (429).")


_ERROR_TEXTS = {
    400: (
        "Bad input (invalid_request, malformed_json, nesting_too_deep, invalid_content, "
        "number_out_of_range, …)."
    ),
    401: "Not authenticated (not_authenticated, authentication_failed).",
    403: "Not allowed (permission_denied).",
    404: "Not found, or not yours (not_found).",
    406: "The Accept header excludes application/json, the only type answered (not_acceptable).",
    409: "Conflict (idempotency_conflict, compaction_in_progress, not_revertible).",
    413: "Body too large (request_too_large, too_many_events).",
    415: "Body is not JSON (unsupported_media_type).",
    422: "Unprocessable (context_window_exhausted, token_usage_total_exceeded).",
    429: (
        "Throttled (throttled; too_many_requests: too many heavy requests at once), with "
        "retryAfter and the Retry-After header."
    ),
    503: "A service the request needs is down (service_unavailable, with Retry-After).",
}

# Every authenticated endpoint can answer these.
COMMON = (401, 403, 406, 429)
# ...and every endpoint that reads a JSON body these.
BODY = (400, 413, 415)


def errors(*codes: int, common: bool = True) -> dict[int, OpenApiResponse]:
    """Responses with the error body for `codes` plus (with `common`) the ones every
    authenticated endpoint has."""
    return {
        code: OpenApiResponse(ErrorSerializer, description=_ERROR_TEXTS[code])
        for code in sorted({*codes, *(COMMON if common else ())})
    }


def page_of(name: str, item: Any) -> type[serializers.Serializer]:
    """The page-number envelope SessionPagination returns around `item` serializers."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": item(many=True),
            "__doc__": f"One page of {item.__name__.removesuffix('Serializer')} objects.",
        },
    )


# The largest value a numeric query parameter may take (a database integer).
MAX_QUERY_INTEGER = 2**63 - 1


def integer(minimum: int, maximum: int = MAX_QUERY_INTEGER) -> dict[str, Any]:
    """A query parameter's schema with the bounds the API enforces (so the documented range
    is the accepted one: outside it, and empty or malformed, is a 400)."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


PAGE_PARAMETERS = [
    OpenApiParameter("page", integer(1), description="Page number, from 1."),
    OpenApiParameter(
        "pageSize", integer(1, 500), description="Items per page (at most 500; more is a 400)."
    ),
]


# --- bounds drf-spectacular cannot see ---------------------------------------------------------

# Text the API stores cannot hold a NUL character (PostgreSQL cannot store it; the rule is the
# same on both profiles): 400 invalid_content. Stated as a pattern on every stored string.
NO_NUL = r"^[^\u0000]*$"


# The characters Python's str.strip() removes (str.isspace): a text of nothing else is blank.
# Spelled out because JSON Schema's regular expressions (ECMA-262) have their own \s.
BLANK_CHARACTERS = (
    r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
# A text that is not blank (unanchored: it holds one character strip() keeps).
NOT_BLANK = f"[^{BLANK_CHARACTERS}]"
# Not blank, and no NUL.
NOT_BLANK_NO_NUL = rf"^[^\u0000]*[^\u0000{BLANK_CHARACTERS}][^\u0000]*$"


def _without_nul(schema: dict[str, Any]) -> dict[str, Any]:
    """A string schema that also refuses NUL."""
    assert "pattern" not in schema, schema
    return {**schema, "pattern": NO_NUL}


def _settings_schema() -> dict[str, Any]:
    """The session settings object as validate_settings checks it (compactThreshold must not
    exceed hardLimitThreshold: a rule between two fields, stated in the description)."""
    from sessions_app.session_settings import MAXIMUMS, STRATEGY_NAMES, SUMMARIZER_NAMES

    ratio = {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 1}

    def integer_setting(minimum: int, key: str, *, nullable: bool = False) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer", "minimum": minimum, "maximum": MAXIMUMS[key]}
        return {**schema, "nullable": True} if nullable else schema

    return {
        "type": "object",
        "additionalProperties": False,
        "description": "Compaction settings; any omitted keeps its current (or default) value. "
        "compactThreshold must not exceed hardLimitThreshold.",
        "properties": {
            "autoCompact": {"type": "boolean"},
            "compactThreshold": ratio,
            "hardLimitThreshold": ratio,
            "fitTargetRatio": ratio,
            "cooldownSeconds": integer_setting(0, "cooldownSeconds"),
            "strategy": {"type": "string", "enum": list(STRATEGY_NAMES)},
            "summarizer": {"type": "string", "enum": list(SUMMARIZER_NAMES)},
            "maxSummaryTokens": integer_setting(16, "maxSummaryTokens", nullable=True),
            "keepRecentEvents": integer_setting(0, "keepRecentEvents"),
            "refreshThresholdTokens": integer_setting(1, "refreshThresholdTokens"),
        },
    }


_CREATABLE: dict[int, list[str]] = {}


def _creatable_models(registry: Any) -> list[str]:
    """The listed models a session can be created with by name alone (a few listed names do
    not resolve back to a window; those need contextLimit like any other name)."""
    key = id(registry)
    if key not in _CREATABLE:
        names = {info.model for info in registry.all_models()}
        _CREATABLE.clear()
        _CREATABLE[key] = sorted(name for name in names if registry.lookup(name) is not None)
    return _CREATABLE[key]


def complete_schema(result: dict[str, Any], generator: Any, request: Any, public: bool) -> Any:
    """drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS): the bounds the services
    enforce that the serializers do not declare, so every request the document allows is
    accepted (tests/api/test_openapi_schema.py runs schemathesis on it)."""
    from django.conf import settings

    from sessions_app.services import MAX_CONTEXT_LIMIT, model_registry
    from sessions_app.session_settings import STRATEGY_NAMES, SUMMARIZER_NAMES
    from sessions_app.usage_over_time import time_zones

    schemas = result.get("components", {}).get("schemas", {})
    context_limit = {"type": "integer", "minimum": 1, "maximum": MAX_CONTEXT_LIMIT}
    models = _creatable_models(model_registry())
    model = {
        "type": "string",
        "enum": models,
        "description": "A known model (GET /api/v1/models); another is 400 unknown_model.",
    }
    if "SessionCreate" in schemas:
        create = schemas["SessionCreate"]["properties"]
        # A known model, or any name with the contextLimit of its window.
        create["model"] = {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": NOT_BLANK_NO_NUL,
            "description": "A known model (GET /api/v1/models), or any other name together "
            "with contextLimit; otherwise 400 unknown_model.",
        }
        create["title"] = _without_nul(create["title"])
        create["systemPrompt"] = _without_nul(create["systemPrompt"])
        schemas["SessionCreate"]["anyOf"] = [
            {"properties": {"model": {"enum": model["enum"]}}},
            {"required": ["contextLimit"], "properties": {"contextLimit": context_limit}},
        ]
        create["contextLimit"] = {**context_limit, "nullable": True}
        create["settings"] = _settings_schema()
    if "PatchedSessionPatch" in schemas:
        patch = schemas["PatchedSessionPatch"]
        patch["properties"]["contextLimit"] = context_limit
        patch["properties"]["settings"] = _settings_schema()
        patch["properties"]["title"] = _without_nul(patch["properties"]["title"])
        patch["additionalProperties"] = False
    if "PatchedEventPatch" in schemas:
        schemas["PatchedEventPatch"]["required"] = ["pinned"]
    if "TokenCountIn" in schemas:
        count = schemas["TokenCountIn"]
        # Any name: an unknown model is counted with the default encoding.
        count["properties"]["model"] = {"type": "string", "minLength": 1}
        count["allOf"] = [
            {"oneOf": [{"required": ["model"]}, {"required": ["encoding"]}]},
            {"oneOf": [{"required": ["text"]}, {"required": ["messages"]}]},
        ]
        count["properties"]["messages"]["items"] = {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"type": "string"},
                "content": {
                    "nullable": True,
                    "oneOf": [
                        {"type": "string"},
                        {"type": "array"},
                        {"type": "object"},
                    ],
                },
            },
        }
    if "RecallIn" in schemas:
        schemas["RecallIn"]["properties"]["maxTokens"]["description"] = (
            "At most the session's contextLimit (else 400)."
        )
        schemas["RecallIn"]["oneOf"] = [{"required": ["query"]}, {"required": ["seqs"]}]
    if "CompactionRequest" in schemas:
        compaction = schemas["CompactionRequest"]["properties"]
        compaction["strategy"] = {"type": "string", "enum": list(STRATEGY_NAMES)}
        compaction["summarizer"] = {"type": "string", "enum": list(SUMMARIZER_NAMES)}
    if "EventAppend" in schemas:
        for variant in schemas["EventAppend"].get("oneOf", []):
            if variant.get("type") == "array":
                variant["minItems"] = 1
                variant["maxItems"] = settings.API_MAX_EVENTS_PER_REQUEST
                variant["description"] = (
                    "Appended together or not at all; an id given twice in one list is "
                    "400 duplicate_id."
                )
    if "EventIn" in schemas:
        event = schemas["EventIn"]
        event["properties"]["content"] = {
            "oneOf": [
                {"type": "string", "pattern": NO_NUL},
                {"type": "array", "items": {}},
                {"type": "object"},
            ],
            "description": "A string, or structured parts (a JSON array or object); no string "
            "in it (keys included) may hold a NUL character.",
        }
        for name in ("name", "toolCallId"):
            event["properties"][name] = _without_nul(event["properties"][name])
        event["properties"]["metadata"]["description"] = (
            "Any JSON object; no string in it (keys included) may hold a NUL character."
        )
        # What EventInSerializer.validate requires per type.
        special = ["TOOL_CALL", "TOOL_RESULT", "CONTEXT_REFRESH"]
        others = [t for t in event_types_enum(schemas) if t not in special]
        text = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL}
        event["oneOf"] = [
            {
                "properties": {"type": {"enum": ["TOOL_CALL"]}, "name": text, "toolCallId": text},
                "required": ["name", "toolCallId"],
            },
            {
                "properties": {"type": {"enum": ["TOOL_RESULT"]}, "toolCallId": text},
                "required": ["toolCallId"],
            },
            {
                "properties": {
                    "type": {"enum": ["CONTEXT_REFRESH"]},
                    "content": {"type": "string", "pattern": r"^\[CONTEXT REFRESH\][^\u0000]*$"},
                },
            },
            {"properties": {"type": {"enum": others}}},
        ]
    if "RecallIn" in schemas:
        schemas["RecallIn"]["properties"]["query"]["minLength"] = 1
        schemas["RecallIn"]["properties"]["query"]["pattern"] = NOT_BLANK
    _link_compactions(result.get("paths", {}))
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict):
                continue
            body = operation.get("requestBody")
            # A body the view needs (only a compaction request may be empty).
            # (A session PATCH without a body changes nothing and answers the session.)
            optional = "/compactions" in path or path.endswith("{session_id}")
            if body is not None and method in ("post", "patch") and not optional:
                body["required"] = True
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "thread" and parameter.get("in") == "query":
                    parameter["schema"] = {"type": "string", "minLength": 1, "maxLength": 200}
                if parameter.get("name") == "tz" and parameter.get("in") == "query":
                    # The names the API accepts, every one (any other is a 400).
                    parameter["schema"] = {"type": "string", "enum": list(time_zones())}
    return result


def _link_compactions(paths: dict[str, Any]) -> None:
    """OpenAPI links from where a compaction's id is answered to the operations that take it
    (clients, and schemathesis's stateful phase, follow them to real runs)."""
    by_id = {"compactions_retrieve": "Get", "compactions_revert_create": "Revert"}
    targets = {
        operation["operationId"]: operation
        for item in paths.values()
        for operation in item.values()
        if isinstance(operation, dict) and operation.get("operationId") in by_id
    }
    sources = [
        ("/sessions/{session_id}/compactions", "post", "202", "$response.body#/id"),
        ("/sessions/{session_id}/context", "post", "200", "$response.body#/compaction/id"),
    ]
    for suffix, method, status, expression in sources:
        for path, item in paths.items():
            response = item.get(method, {}).get("responses", {}).get(status)
            if not path.endswith(suffix) or response is None:
                continue
            response["links"] = {
                f"{by_id[operation_id]}Compaction": {
                    "operationId": operation_id,
                    "parameters": {"compaction_id": expression},
                }
                for operation_id in targets
            }


def event_types_enum(schemas: dict[str, Any]) -> list[str]:
    """The event types a client may append (the EventIn type enum)."""
    enum = schemas.get("EventInTypeEnum", {}).get("enum")
    if enum:
        return [str(value) for value in enum]
    from sessions_app.api.serializers import CLIENT_EVENT_TYPES

    return list(CLIENT_EVENT_TYPES)
