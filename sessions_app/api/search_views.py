"""Search and recall endpoints: validate, call sessions_app.search or sessions_app.recall, serialise."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions_app import recall, search, selectors
from sessions_app.api.openapi import BODY, NOT_BLANK, errors, integer
from sessions_app.api.serializers import StrictCharField
from sessions_app.errors import InvalidInput
from sessions_app.heavy import heavy_slot
from sessions_app.services import MAX_CONTEXT_LIMIT

_HIT_FIELDS: dict[str, serializers.Field] = {
    "seq": serializers.IntegerField(),
    "eventId": serializers.UUIDField(),
    "type": serializers.CharField(),
    "name": serializers.CharField(),
    "folded": serializers.BooleanField(),
    "snippet": serializers.CharField(
        help_text="Plain text around the first match (not HTML: escape it to show it in a "
        "page); `…` marks a cut."
    ),
    "matches": serializers.ListField(
        child=inline_serializer(
            "SearchMatch",
            {"start": serializers.IntegerField(), "end": serializers.IntegerField()},
        ),
        help_text="Where the query matches in `snippet`: [start, end) offsets in characters "
        "(Unicode code points), in order.",
    ),
}
_SEARCH_PARAMETERS = [
    OpenApiParameter(
        "q",
        # Not blank, and at most MAX_QUERY_CHARS: what search.check_query enforces.
        {
            "type": "string",
            "minLength": 1,
            "maxLength": search.MAX_QUERY_CHARS,
            "pattern": NOT_BLANK,
        },
        required=True,
        description="Words, identifiers or paths.",
    ),
    OpenApiParameter(
        "limit", integer(1, search.MAX_LIMIT), description=f"1..{search.MAX_LIMIT} (default 20)."
    ),
]


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return search.DEFAULT_LIMIT
    # An empty `limit=` is malformed, not "the default" (as on every other endpoint).
    # ASCII digits only: int() would also take "1_0" or " 5".
    value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else 0
    if not 1 <= value <= search.MAX_LIMIT:
        raise InvalidInput(
            f"limit must be an integer between 1 and {search.MAX_LIMIT}",
            code="invalid_parameter",
            fields={"limit": f"between 1 and {search.MAX_LIMIT}"},
        )
    return value


def hit_out(hit: search.SearchHit, *, with_session: bool = False) -> dict[str, Any]:
    event = hit.event
    out: dict[str, Any] = {
        "seq": event.seq,
        "eventId": str(event.pk),
        "type": event.type,
        "name": event.name,
        "folded": hit.folded,
        "snippet": hit.snippet.text,
        "matches": [{"start": start, "end": end} for start, end in hit.snippet.matches],
    }
    if with_session:
        out["sessionId"] = str(event.session_id)
        out["sessionTitle"] = hit.session_title
    return out


class SessionSearchView(APIView):
    @extend_schema(
        parameters=_SEARCH_PARAMETERS,
        responses={
            200: inline_serializer(
                "SessionSearchOut",
                {
                    "results": inline_serializer("SearchHit", _HIT_FIELDS, many=True),
                    "indexing": serializers.BooleanField(
                        help_text="True while some of the session's events are still being "
                        "indexed (SQLite: a large backlog is indexed in the background, in "
                        "short batches); the results then cover the events up to "
                        "indexedThrough. Search again later to see the rest."
                    ),
                    "indexedThrough": serializers.IntegerField(
                        min_value=0,
                        help_text="Every event up to this seq was searched.",
                    ),
                },
            ),
            **errors(400, 404),
        },
        description="Full-text search over every event of the session, folded ones included.",
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        text = search.check_query(request.query_params.get("q"))
        hits, progress = search.search_session_with_state(
            session=session, text=text, limit=_limit(request)
        )
        return Response(
            {
                "results": [hit_out(hit) for hit in hits],
                "indexing": progress.indexing,
                "indexedThrough": progress.indexed_through,
            }
        )


class SearchView(APIView):
    @extend_schema(
        parameters=_SEARCH_PARAMETERS,
        responses={
            200: inline_serializer(
                "SearchOut",
                {
                    "results": inline_serializer(
                        "SessionSearchHit",
                        {
                            **_HIT_FIELDS,
                            "sessionId": serializers.UUIDField(),
                            "sessionTitle": serializers.CharField(),
                        },
                        many=True,
                    )
                },
            ),
            **errors(400),
        },
        description="Full-text search across your sessions (staff: every session).",
    )
    def get(self, request: Request) -> Response:
        text = search.check_query(request.query_params.get("q"))
        hits = search.search_sessions(user=request.user, text=text, limit=_limit(request))
        return Response({"results": [hit_out(hit, with_session=True) for hit in hits]})


class RecallInSerializer(serializers.Serializer):
    # Text only: a number is not a query.
    query = StrictCharField(
        required=False,
        max_length=search.MAX_QUERY_CHARS,
        allow_blank=False,
        trim_whitespace=True,
    )
    seqs = serializers.ListField(
        # Bounded like the seq column, so a huge number is a 400, not a database overflow.
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        min_length=1,
        max_length=recall.RECALL_MAX_SEQS,
    )
    maxTokens = serializers.IntegerField(  # noqa: N815 - API name
        required=False, min_value=1, max_value=MAX_CONTEXT_LIMIT
    )
    format = serializers.ChoiceField(choices=["openai", "anthropic"], default="openai")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("query" in attrs) == ("seqs" in attrs):
            raise serializers.ValidationError({"query": "give exactly one of query or seqs"})
        return attrs


class RecallView(APIView):
    @extend_schema(
        request=RecallInSerializer,
        responses={200: OpenApiTypes.OBJECT, **errors(*BODY, 404)},
        description="Original events (folded ones included) as messages ready to send, "
        "within maxTokens; a TOOL_CALL and its TOOL_RESULT always come together.",
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        if not isinstance(request.data, dict):
            raise InvalidInput(
                "body must be a JSON object",
                code="invalid_request",
                fields={"body": "must be an object"},
            )
        body = RecallInSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        with heavy_slot(user_id=request.user.pk):
            result = recall.recall(
                session=session,
                text=data.get("query"),
                seqs=data.get("seqs"),
                max_tokens=recall.recall_budget(session=session, max_tokens=data.get("maxTokens")),
                fmt=data["format"],
            )
        payload: dict[str, Any] = {
            "messages": result.messages,
            "tokenCount": result.token_count,
            "maxTokens": result.max_tokens,
            "events": [
                {
                    "seq": event.seq,
                    "eventId": str(event.pk),
                    "type": event.type,
                    "folded": event.compacted_by_id is not None,
                }
                for event in result.events
            ],
            "omitted": result.omitted,
            "missing": result.missing,
        }
        if data["format"] == "anthropic":
            payload["system"] = result.system
        return Response(payload)
