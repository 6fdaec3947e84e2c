"""The calls API: every gateway call, a session's (`/sessions/{id}/calls`) or every session's
the caller may see (`/calls`; staff: every user's), newest first, filtered and paginated, with
the filtered range's totals, error rate and latency percentiles beside the page."""

from __future__ import annotations

import datetime
import re
from typing import Any
from zoneinfo import ZoneInfo

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions_app import calls, selectors, usage_over_time
from sessions_app.api.openapi import PAGE_PARAMETERS, ErrorSerializer, errors
from sessions_app.api.views import SessionPagination
from sessions_app.errors import InvalidInput
from sessions_app.models import CallStatus

_STATUS = "|".join(CallStatus.values)
_STATUS_LIST = rf"^({_STATUS})(,({_STATUS}))*$"
# RFC 3339's date-time (the schema's `format: date-time`), T and Z in either case.
_DATE_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)

USER_PARAMETER = OpenApiParameter(
    "user",
    {"type": "string", "pattern": "^[0-9]{1,12}$"},
    description="Staff: only this user's calls (anyone else: 403 permission_denied).",
)
CALL_PARAMETERS = [
    OpenApiParameter(
        "since",
        {"type": "string", "format": "date-time"},
        description="Only calls started at or after this moment (RFC 3339, with its offset).",
    ),
    OpenApiParameter(
        "until",
        {"type": "string", "format": "date-time"},
        description="Only calls started before this moment (RFC 3339, with its offset).",
    ),
    OpenApiParameter(
        "status",
        {"type": "string", "pattern": _STATUS_LIST},
        description="Only calls that ended so; several comma-separated: "
        + ", ".join(CallStatus.values)
        + ".",
    ),
    OpenApiParameter(
        "model",
        {"type": "string", "minLength": 1, "maxLength": 200},
        description="Only calls that asked for or were served by this model.",
    ),
    OpenApiParameter("thread", str, description="Only the calls of this thread (its key)."),
    OpenApiParameter(
        "q",
        {"type": "string", "minLength": 1, "maxLength": 200},
        description="Text in the model, the session's title or the error message.",
    ),
    OpenApiParameter(
        "sort",
        {"type": "string", "enum": [k for key in calls.SORTS for k in (key, "-" + key)]},
        description="The order (a leading - reverses); default -started, newest first.",
    ),
    OpenApiParameter("session", str, description="Only this session's calls (`/calls`)."),
    USER_PARAMETER,
    OpenApiParameter(
        "export",
        {"type": "string", "enum": ["csv", "ndjson"]},
        description="Stream every filtered call (no pages) as CSV or newline-delimited JSON; "
        "the same as `Accept: text/csv` or `Accept: application/x-ndjson`.",
    ),
    *PAGE_PARAMETERS,
]

_PERCENTILES = inline_serializer(
    "CallLatency",
    {
        name: serializers.IntegerField(allow_null=True, help_text="Milliseconds.")
        for name in ("p50", "p90", "p99")
    },
)
CALL_FIELDS: dict[str, serializers.Field] = {
    "id": serializers.UUIDField(),
    "sessionId": serializers.UUIDField(
        allow_null=True,
        help_text="Null: refused before any session existed (a first call naming an unknown "
        "model, a body that is not JSON); it joins the session its key later creates.",
    ),
    "sessionKey": serializers.CharField(
        allow_blank=True, help_text="The X-Ledger-Session header the client sent."
    ),
    "startedAt": serializers.DateTimeField(),
    "wire": serializers.CharField(help_text="openai, responses or anthropic."),
    "thread": serializers.CharField(allow_blank=True),
    "modelRequested": serializers.CharField(allow_blank=True),
    "modelServed": serializers.CharField(
        allow_blank=True, help_text="The model that answered (a failover's), else blank."
    ),
    "status": serializers.ChoiceField(choices=CallStatus.values),
    "httpStatus": serializers.IntegerField(
        allow_null=True, help_text="What the client got; null when it went away first."
    ),
    "errorCode": serializers.CharField(allow_blank=True),
    "error": serializers.CharField(allow_blank=True),
    "stream": serializers.BooleanField(),
    "ttfbMs": serializers.IntegerField(
        allow_null=True,
        help_text="From the request to the provider's first byte (a stream's first chunk).",
    ),
    "totalMs": serializers.IntegerField(allow_null=True),
    "promptTokens": serializers.IntegerField(allow_null=True),
    "cachedInputTokens": serializers.IntegerField(allow_null=True),
    "cacheWriteTokens": serializers.IntegerField(allow_null=True),
    "cacheWrite1hTokens": serializers.IntegerField(
        allow_null=True, help_text="Part of cacheWriteTokens at the one-hour rate (Anthropic)."
    ),
    "completionTokens": serializers.IntegerField(allow_null=True),
    "reasoningTokens": serializers.IntegerField(
        allow_null=True, help_text="Part of completionTokens the model spent reasoning."
    ),
    "totalTokens": serializers.IntegerField(allow_null=True),
    "usage": serializers.ChoiceField(
        choices=["reported", "absent"],
        allow_null=True,
        help_text="reported: the provider's figures; absent: it answered without usage and "
        "the figures are the gateway's own count (costEstimated); null: no reply.",
    ),
    "costUsd": serializers.FloatField(allow_null=True),
    "costEstimated": serializers.BooleanField(
        help_text="costUsd is the gateway's estimate: the provider sent no usage."
    ),
    "costByKind": serializers.DictField(
        child=serializers.DictField(),
        allow_null=True,
        help_text="The cost per token kind, each {tokens, usd}: input (uncached), cacheRead, "
        "cacheWrite5m, cacheWrite1h, output, reasoning (a part of output).",
    ),
    "cache": serializers.DictField(
        allow_null=True,
        help_text="Why the call hit or missed the provider's prompt cache: {outcome (hit, "
        "partial, miss, not_cacheable), reason, change, by, firstChangedMessage {index, role, "
        "change, block?}, sharedTokens, predictedCachedTokens, providerCachedTokens, agrees, "
        "contradiction, …} (docs/costs.md); null when not predicted.",
    ),
    "fitted": serializers.BooleanField(),
    "forwardedTokens": serializers.IntegerField(allow_null=True),
    "savedTokens": serializers.IntegerField(),
    "failovers": serializers.IntegerField(),
    "attempts": serializers.ListField(
        child=serializers.DictField(),
        help_text='Every model tried, in order: {"model", "outcome", "httpStatus"?}.',
    ),
    "replySeq": serializers.IntegerField(
        allow_null=True, help_text="The seq of the reply's first event."
    ),
    "usageDropped": serializers.DictField(
        child=serializers.CharField(),
        help_text="Usage figures the provider reported that the token fields leave out, by "
        "field name, with why (out of range, not a whole number, cache parts above the prompt).",
    ),
}
SUMMARY = inline_serializer(
    "CallSummary",
    {
        "calls": serializers.IntegerField(),
        "errors": serializers.IntegerField(),
        "errorRate": serializers.FloatField(allow_null=True, help_text="Percent, one decimal."),
        "failovers": serializers.IntegerField(),
        "fitted": serializers.IntegerField(),
        "promptTokens": serializers.IntegerField(),
        "cachedInputTokens": serializers.IntegerField(),
        "cacheWriteTokens": serializers.IntegerField(),
        "completionTokens": serializers.IntegerField(),
        "totalTokens": serializers.IntegerField(),
        "savedTokens": serializers.IntegerField(),
        "costUsd": serializers.FloatField(),
        "unpricedCalls": serializers.IntegerField(),
        "latencyMs": inline_serializer(
            "CallLatencies", {"ttfb": _PERCENTILES, "total": _PERCENTILES}
        ),
        "sampled": serializers.IntegerField(
            help_text="How many of the range's newest calls the percentiles are taken over."
        ),
    },
)
CALL_PAGE = inline_serializer(
    "CallPage",
    {
        "count": serializers.IntegerField(),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": inline_serializer("Call", CALL_FIELDS, many=True),
        "summary": SUMMARY,
    },
)


def _moment(request: Request, name: str) -> datetime.datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    problem = f"{name} must be an RFC 3339 date-time with its offset (2026-01-31T09:00:00Z)"
    if not _DATE_TIME.fullmatch(raw):
        raise InvalidInput(problem, code="invalid_parameter", fields={name: problem})
    text = raw.upper().replace("Z", "+00:00")
    if text[17:19] == "60":  # a leap second: its moment is the next second's start
        text = text[:17] + "59" + text[19:]
    try:
        value = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(problem, code="invalid_parameter", fields={name: problem}) from None
    try:
        return value.astimezone(datetime.UTC)
    except OverflowError:
        # Past either end of the calendar in UTC: every call is after the one, before the other.
        edge = datetime.datetime.min if value.year == 1 else datetime.datetime.max
        return edge.replace(tzinfo=datetime.UTC)


def _text(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not 0 < len(raw) <= 200:
        raise InvalidInput(
            f"{name} must be 1 to 200 characters",
            code="invalid_parameter",
            fields={name: "must be 1 to 200 characters"},
        )
    return raw


def _user_id(request: Request) -> int | None:
    """The `user` filter: a user id (else 400), and staff's only. Another user's calls are
    theirs to keep: a well-formed request for them is not bad input but one this caller is
    not allowed to make (403, as for anything else only staff may do)."""
    raw = request.query_params.get("user")
    if raw is None:
        return None
    # Empty is malformed too (the schema's pattern), not the filter left out.
    if not raw.isdigit() or len(raw) > 12:
        raise InvalidInput(
            "user must be a user id", code="invalid_parameter", fields={"user": raw[:20]}
        )
    if not getattr(request.user, "is_staff", False):
        raise PermissionDenied("only staff may ask for another user's calls")
    return int(raw)


def _filters(request: Request) -> calls.CallFilters:
    statuses: tuple[str, ...] = ()
    raw = request.query_params.get("status")
    if raw is not None:
        if not re.fullmatch(_STATUS_LIST, raw):
            raise InvalidInput(
                "status must be one or more of " + ", ".join(CallStatus.values),
                code="invalid_parameter",
                fields={"status": "comma-separated call statuses"},
            )
        statuses = tuple(raw.split(","))
    session_id = None
    raw_session = request.query_params.get("session")
    if raw_session:
        session_id = selectors.session_get(user=request.user, session_id=raw_session).pk
    user_id = _user_id(request)
    return calls.CallFilters(
        since=_moment(request, "since"),
        until=_moment(request, "until"),
        statuses=statuses,
        model=_text(request, "model"),
        thread=_text(request, "thread"),
        search=_text(request, "q"),
        session_id=session_id,
        user_id=user_id,
    )


def _sorted(request: Request, queryset: Any) -> Any:
    try:
        return calls.ordered(queryset, request.query_params.get("sort"))
    except ValueError as exc:
        raise InvalidInput(str(exc), code="invalid_parameter", fields={"sort": "unknown"}) from None


EXPORTS = {"csv": "text/csv", "ndjson": "application/x-ndjson"}


def export_kind(request: Request) -> str | None:
    """csv or ndjson when the client asked for a stream of every row (`export=` or Accept)."""
    asked = request.query_params.get("export")
    if asked:
        if asked not in EXPORTS:
            raise InvalidInput(
                "export must be csv or ndjson",
                code="invalid_parameter",
                fields={"export": asked[:20]},
            )
        return asked
    accept = request.META.get("HTTP_ACCEPT", "")
    for kind, media in EXPORTS.items():
        if media in accept:
            return kind
    return None


def _stream(kind: str, queryset: Any) -> StreamingHttpResponse:
    lines = calls.csv_lines(queryset) if kind == "csv" else calls.ndjson_lines(queryset)
    response = StreamingHttpResponse(lines, content_type=f"{EXPORTS[kind]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="calls.{kind}"'
    return response


class _Exportable(APIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # text/csv and NDJSON are answered by the view itself (a stream), not by a renderer.
        accept = request.META.get("HTTP_ACCEPT", "")
        return super().perform_content_negotiation(
            request, force=force or any(media in accept for media in EXPORTS.values())
        )


# What a calls list answers: a page (JSON), or every filtered row streamed (`export=` or
# Accept), each media type documented so a client (and schemathesis) knows all three.
CALL_LIST_RESPONSES: dict[Any, OpenApiResponse] = {
    (200, "application/json"): OpenApiResponse(
        CALL_PAGE,
        description="A page of calls (application/json), or with `export=` or `Accept: "
        "text/csv` / `application/x-ndjson` every filtered call streamed: CSV with a header "
        "line, or one JSON document per line.",
    ),
    (200, EXPORTS["csv"]): OpenApiResponse(OpenApiTypes.STR),
    (200, EXPORTS["ndjson"]): OpenApiResponse(OpenApiTypes.STR),
    **errors(400, 404),
    406: OpenApiResponse(
        ErrorSerializer,
        description="The Accept header excludes application/json, text/csv and "
        "application/x-ndjson, the types answered (not_acceptable).",
    ),
}


def _page(request: Request, view: APIView, queryset: Any) -> Any:
    queryset = _sorted(request, queryset)
    kind = export_kind(request)
    if kind is not None:
        # Every row, no page; a malformed page or pageSize is refused all the same.
        SessionPagination.check_parameters(request)
        return _stream(kind, queryset)
    paginator = SessionPagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    response = paginator.get_paginated_response([calls.call_document(call) for call in page])
    response.data["summary"] = calls.calls_summary(queryset)
    return response


class SessionCallsView(_Exportable):
    @extend_schema(
        operation_id="sessions_calls_list",
        parameters=CALL_PARAMETERS,
        responses=CALL_LIST_RESPONSES,
    )
    def get(self, request: Request, session_id: str) -> Any:
        session = selectors.session_get(user=request.user, session_id=session_id)
        filters = _filters(request)
        return _page(
            request,
            self,
            calls.calls_visible_to(user=request.user, session=session, filters=filters),
        )


class CallsView(_Exportable):
    @extend_schema(
        operation_id="calls_list",
        parameters=CALL_PARAMETERS,
        responses=CALL_LIST_RESPONSES,
    )
    def get(self, request: Request) -> Any:
        filters = _filters(request)
        return _page(request, self, calls.calls_visible_to(user=request.user, filters=filters))


# --- usage over time ----------------------------------------------------------------------------


def _zone(raw: str | None) -> ZoneInfo:
    if not raw:
        return ZoneInfo("UTC")
    # Only the names the schema lists (usage_over_time.time_zones): ZoneInfo would also take
    # a few the schema does not (the server's `localtime`).
    if raw not in usage_over_time.time_zones():
        raise InvalidInput(
            "tz must be an IANA time zone (Europe/Paris, America/New_York, UTC)",
            code="invalid_parameter",
            fields={"tz": "unknown time zone"},
        )
    return ZoneInfo(raw)


def usage_parameters(request: Request) -> dict[str, Any]:
    """The usage-over-time query's parameters, validated (InvalidInput otherwise)."""
    bucket = request.query_params.get("bucket") or "hour"
    if bucket not in usage_over_time.BUCKETS:
        raise InvalidInput(
            "bucket must be hour or day", code="invalid_parameter", fields={"bucket": bucket[:20]}
        )
    group_by = request.query_params.get("groupBy") or None
    if group_by is not None and group_by not in usage_over_time.GROUPS:
        raise InvalidInput(
            "groupBy must be one of " + ", ".join(usage_over_time.GROUPS),
            code="invalid_parameter",
            fields={"groupBy": group_by[:20]},
        )
    until = _moment(request, "until") or datetime.datetime.now(datetime.UTC)
    span = datetime.timedelta(days=1 if bucket == "hour" else 30)
    since = _moment(request, "since")
    if since is None:
        try:
            since = until - span
        except OverflowError:  # an until in the calendar's first day
            since = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    session_id = None
    raw_session = request.query_params.get("session")
    if raw_session:
        session_id = selectors.session_get(user=request.user, session_id=raw_session).pk
    user_id = _user_id(request)
    return {
        "since": since,
        "until": until,
        "bucket": bucket,
        "group_by": group_by,
        "tz": _zone(request.query_params.get("tz")),
        "session_id": session_id,
        "user_id": user_id,
    }


# The range's bounds between since and until, which no JSON schema can state, said where a
# client reads them: since before until, and at most MAX_PERIODS buckets apart (else 400).
_RANGE = (
    "since must be before until, at most "
    f"{usage_over_time.MAX_PERIODS:,} hours or days (`bucket`) apart (else 400)."
)
USAGE_PARAMETERS = [
    OpenApiParameter(
        "since",
        {"type": "string", "format": "date-time"},
        description="The range's start (RFC 3339, with its offset); default a day (hours) or "
        "30 days (days) before until. " + _RANGE,
    ),
    OpenApiParameter(
        "until",
        {"type": "string", "format": "date-time"},
        description="The range's end, exclusive (RFC 3339, with its offset); default now. "
        + _RANGE,
    ),
    OpenApiParameter("bucket", {"type": "string", "enum": list(usage_over_time.BUCKETS)}),
    OpenApiParameter("groupBy", {"type": "string", "enum": list(usage_over_time.GROUPS)}),
    # Its enum, the zone names the server knows, is filled in when the schema is generated
    # (sessions_app.api.openapi.complete_schema): listing them reads the whole database.
    OpenApiParameter(
        "tz",
        str,
        description="IANA time zone the hours and days are the viewer's in (default UTC).",
    ),
    OpenApiParameter("session", str, description="Only this session's calls."),
    USER_PARAMETER,
]

# A class, not inline_serializer's instance: one component every figures field refers to.
UsageFigures = type(
    "UsageFigures",
    (serializers.Serializer,),
    {
        "calls": serializers.IntegerField(),
        "errors": serializers.IntegerField(),
        "errorRate": serializers.FloatField(allow_null=True, help_text="Percent, one decimal."),
        "promptTokens": serializers.IntegerField(),
        "cachedInputTokens": serializers.IntegerField(),
        "cacheWriteTokens": serializers.IntegerField(),
        "completionTokens": serializers.IntegerField(),
        "totalTokens": serializers.IntegerField(),
        "costUsd": serializers.FloatField(),
        "cacheHitRate": serializers.FloatField(
            allow_null=True, help_text="Cache reads ÷ all input tokens; null before any."
        ),
        "latencyMs": inline_serializer(
            "UsageLatency",
            {
                name: serializers.IntegerField(
                    allow_null=True, help_text="The call's total latency, milliseconds."
                )
                for name in ("p50", "p99")
            },
        ),
    },
)
USAGE_OVER_TIME = inline_serializer(
    "UsageOverTime",
    {
        "since": serializers.DateTimeField(help_text="The first period's start, in UTC."),
        "until": serializers.DateTimeField(),
        "bucket": serializers.ChoiceField(choices=list(usage_over_time.BUCKETS)),
        "tz": serializers.CharField(),
        "groupBy": serializers.ChoiceField(choices=list(usage_over_time.GROUPS), allow_null=True),
        # Plain strings: an old date in some zones has an offset in seconds (local mean
        # time), which RFC 3339's date-time cannot hold.
        "periods": serializers.ListField(
            child=serializers.CharField(),
            help_text="Each period's local start (ISO 8601, with the zone's offset then).",
        ),
        "series": inline_serializer(
            "UsageSeries",
            {
                "key": serializers.CharField(allow_blank=True),
                "label": serializers.CharField(allow_blank=True),
                "points": UsageFigures(many=True),
                "totals": UsageFigures(),
            },
            many=True,
            help_text="The groups with the most calls; the rest summed as `other`.",
        ),
        "points": UsageFigures(many=True, help_text="Every group, per period."),
        "totals": UsageFigures(),
    },
)


class UsageOverTimeView(APIView):
    @extend_schema(
        operation_id="usage_calls",
        parameters=USAGE_PARAMETERS,
        responses={
            200: OpenApiResponse(
                USAGE_OVER_TIME,
                description="Per period (hour or day in `tz`) and group: calls, errors, error "
                "rate, tokens by kind, cost, cache hit rate, p50/p99 latency.",
            ),
            **errors(400, 404),
        },
    )
    def get(self, request: Request) -> Response:
        params = usage_parameters(request)
        try:
            data = usage_over_time.usage_over_time(user=request.user, **params)
        except usage_over_time.BadRange as exc:
            raise InvalidInput(str(exc), code="invalid_parameter") from None
        return Response(data)
