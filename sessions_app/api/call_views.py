"""The calls API: every gateway call, a session's (`/sessions/{id}/calls`) or every session's
the caller may see (`/calls`; staff: every user's), newest first, filtered and paginated, with
the filtered range's totals, error rate and latency percentiles beside the page."""

from __future__ import annotations

import datetime
import re
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions_app import calls, selectors
from sessions_app.api.openapi import PAGE_PARAMETERS, errors
from sessions_app.api.views import SessionPagination
from sessions_app.errors import InvalidInput
from sessions_app.models import CallStatus

_STATUS = "|".join(CallStatus.values)
_STATUS_LIST = rf"^({_STATUS})(,({_STATUS}))*$"
# RFC 3339's date-time (the schema's `format: date-time`), T and Z in either case.
_DATE_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
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
    "sessionId": serializers.UUIDField(),
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
    "completionTokens": serializers.IntegerField(allow_null=True),
    "totalTokens": serializers.IntegerField(allow_null=True),
    "costUsd": serializers.FloatField(allow_null=True),
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
    return calls.CallFilters(
        since=_moment(request, "since"),
        until=_moment(request, "until"),
        statuses=statuses,
        model=_text(request, "model"),
        thread=_text(request, "thread"),
    )


def _page(request: Request, view: APIView, queryset: Any) -> Response:
    paginator = SessionPagination()
    page = paginator.paginate_queryset(queryset, request, view=view)
    response = paginator.get_paginated_response([calls.call_document(call) for call in page])
    response.data["summary"] = calls.calls_summary(queryset)
    return response


class SessionCallsView(APIView):
    @extend_schema(
        operation_id="sessions_calls_list",
        parameters=CALL_PARAMETERS,
        responses={200: CALL_PAGE, **errors(400, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        filters = _filters(request)
        return _page(
            request,
            self,
            calls.calls_visible_to(user=request.user, session=session, filters=filters),
        )


class CallsView(APIView):
    @extend_schema(
        operation_id="calls_list",
        parameters=CALL_PARAMETERS,
        responses={200: CALL_PAGE, **errors(400, 404)},
    )
    def get(self, request: Request) -> Response:
        filters = _filters(request)
        return _page(request, self, calls.calls_visible_to(user=request.user, filters=filters))
