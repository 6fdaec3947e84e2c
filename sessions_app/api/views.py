"""REST API views: validate, call one service or selector, serialise."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions_app import selectors, services, tokens
from sessions_app.api import serializers as s
from sessions_app.api.openapi import BODY, PAGE_PARAMETERS, errors, integer, page_of
from sessions_app.errors import InvalidInput, LedgerError
from sessions_app.models import Event, EventType
from sessions_app.signals import compaction_command
from sessions_app.threads import session_threads

# The largest page any list serves (sessions, compactions, calls): a larger pageSize is a
# 400, as any number out of its documented range (DRF alone would quietly serve 500).
MAX_PAGE_SIZE = 500


class SessionPagination(PageNumberPagination):
    page_size_query_param = "pageSize"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int | None:
        self.page_size = settings.API_PAGE_SIZE
        return super().get_page_size(request)

    @staticmethod
    def check_parameters(request: Request) -> None:
        """400 invalid_parameter for a malformed page or pageSize (DRF ignores a malformed
        pageSize and answers 404 for a malformed page: both are bad input, answered like any
        other query parameter). Also for answers that take them but are not a page (an
        export): what the schema refuses is refused wherever it is sent."""
        _int_param(request, "page", 1, minimum=1)
        _int_param(request, "pageSize", 1, minimum=1, maximum=MAX_PAGE_SIZE)

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        self.check_parameters(request)
        return super().paginate_queryset(queryset, request, view)


SessionPage = page_of("SessionPage", s.SessionOutSerializer)

# One event object or a list of them, in and out.
EVENT_OR_LIST_IN = PolymorphicProxySerializer(
    component_name="EventAppend",
    serializers=[s.EventInSerializer, s.EventInSerializer(many=True)],
    resource_type_field_name=None,
    many=False,
)
EVENT_OR_LIST_OUT = PolymorphicProxySerializer(
    component_name="EventAppended",
    serializers=[s.EventOutSerializer, s.EventOutSerializer(many=True)],
    resource_type_field_name=None,
    many=False,
)


class SessionListView(APIView):
    @extend_schema(
        operation_id="sessions_list",
        parameters=PAGE_PARAMETERS,
        responses={200: SessionPage, **errors(400, 404)},
    )
    def get(self, request: Request) -> Response:
        queryset = selectors.sessions_visible_to(user=request.user).select_related("owner")
        paginator = SessionPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(s.SessionOutSerializer(page, many=True).data)

    @extend_schema(
        request=s.SessionCreateSerializer,
        responses={201: s.SessionOutSerializer, **errors(*BODY)},
    )
    def post(self, request: Request) -> Response:
        body = s.SessionCreateSerializer(data=_object(request.data))
        body.is_valid(raise_exception=True)
        data = body.validated_data
        session = services.session_create(
            owner=request.user,  # type: ignore[arg-type]
            model=data["model"],
            title=data.get("title", ""),
            context_limit=data.get("contextLimit"),
            system_prompt=data.get("systemPrompt"),
            settings=data.get("settings"),
        )
        return Response(s.SessionOutSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    @extend_schema(responses={200: s.SessionOutSerializer, **errors(404)})
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        return Response(s.SessionOutSerializer(session).data)

    @extend_schema(
        request=s.SessionPatchSerializer,
        responses={200: s.SessionOutSerializer, **errors(*BODY, 404)},
    )
    def patch(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        body = s.SessionPatchSerializer(data=_object(request.data))
        body.is_valid(raise_exception=True)
        data = body.validated_data
        session = services.session_update(
            session=session,
            title=data.get("title"),
            context_limit=data.get("contextLimit"),
            settings=data.get("settings"),
        )
        return Response(s.SessionOutSerializer(session).data)

    @extend_schema(responses={204: None, **errors(404)})
    def delete(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        services.session_delete(session=session)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SessionEventsView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after", integer(0), description="Return events with seq greater than this."
            ),
            OpenApiParameter(
                "limit", integer(1, 1000), description="Page size, 1..1000 (default 100)."
            ),
            OpenApiParameter(
                "includeCompacted", bool, description="Include events folded by compaction."
            ),
            OpenApiParameter(
                "thread", str, description="Only the events of this thread (its key)."
            ),
        ],
        responses={200: s.EventPageSerializer, **errors(400, 404)},
        operation_id="sessions_events_list",
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        after = _int_param(request, "after", 0, minimum=0)
        limit = _int_param(request, "limit", 100, minimum=1, maximum=1000)
        include = _bool_param(request, "includeCompacted")
        thread = request.query_params.get("thread")
        if thread is not None and not 0 < len(thread) <= 200:
            raise InvalidInput(
                "thread must be a thread key (1 to 200 characters)",
                code="invalid_parameter",
                fields={"thread": "must be 1 to 200 characters"},
            )
        events, next_after = selectors.events_page(
            session=session, after=after, limit=limit, include_compacted=include, thread=thread
        )
        return Response({"results": s.event_out(events), "nextAfter": next_after})

    @extend_schema(
        request=EVENT_OR_LIST_IN,
        responses={
            201: OpenApiResponse(
                EVENT_OR_LIST_OUT,
                description="Stored: the event, or the list, as sent. An event whose content "
                f"is longer than {s.APPEND_ANSWER_MAX_CONTENT_CHARS:,} characters (as stored: "
                "structured content as its JSON text) is answered with content null; "
                "GET .../events/{eventId} returns it.",
            ),
            200: OpenApiResponse(
                EVENT_OR_LIST_OUT,
                description="Every event was an identical retry of a stored one (answered as "
                "the 201, large contents null).",
            ),
            202: OpenApiResponse(
                OpenApiTypes.OBJECT, description="/compact: the compaction run that started."
            ),
            **errors(*BODY, 404, 409, 422, 503),
        },
        description="One event object or a list (bulk, atomic). A USER_MESSAGE starting with "
        "/compact starts a manual compaction instead (202). A client-supplied id makes a "
        "retry idempotent; the same id with a different body is 409 idempotency_conflict.",
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        data = request.data
        single = isinstance(data, dict)
        items = [data] if single else data
        if not isinstance(items, list):
            raise InvalidInput(
                "body must be an event object or a list of events", code="invalid_request"
            )
        if len(items) > settings.API_MAX_EVENTS_PER_REQUEST:
            raise LedgerError(
                f"at most {settings.API_MAX_EVENTS_PER_REQUEST} events per request",
                code="too_many_events",
                limit=settings.API_MAX_EVENTS_PER_REQUEST,
            )
        # A single event validates on its own so field paths read "content", a list's "[2].content".
        inputs = s.parse_events(data, single=single)
        commands = [
            index
            for index, item in enumerate(inputs)
            if item.type == EventType.USER_MESSAGE
            and isinstance(item.content, str)
            and item.content.lstrip().startswith(services.COMPACT_COMMAND)
        ]
        if commands:
            if not single:
                raise InvalidInput(
                    "/compact must be sent alone, not inside a bulk list",
                    code="compact_command_in_bulk",
                    fields={f"[{commands[0]}].content": "send /compact as a single event"},
                )
            return _compact_command(request, session, inputs[0].content)
        try:
            result = services.event_append(session=session, events=inputs)
        except LedgerError as exc:
            if single:
                _unprefix_fields(exc)
            raise
        code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        payload: Any = s.event_out(
            result.events, content_max_chars=s.APPEND_ANSWER_MAX_CONTENT_CHARS
        )
        return Response(payload[0] if single else payload, status=code)


def _unprefix_fields(exc: LedgerError) -> None:
    """Services name fields by list position ("[0].content"); a single event's are bare."""
    fields = exc.extra.get("fields")
    if isinstance(fields, dict):
        exc.extra["fields"] = {
            (key[len("[0].") :] if key.startswith("[0].") else key): value
            for key, value in fields.items()
        }


def _compact_command(request: Request, session: Any, content: str) -> Response:
    arguments = content.lstrip()[len(services.COMPACT_COMMAND) :].split()
    for _receiver, response in compaction_command.send(
        sender=Event, session=session, user=request.user, arguments=arguments
    ):
        if response is not None:
            return Response(response, status=status.HTTP_202_ACCEPTED)
    return Response(
        {"error": "compaction_unavailable", "detail": "compaction is not installed"},
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


class SessionThreadsView(APIView):
    @extend_schema(
        responses={200: s.ThreadPageSerializer, **errors(404)},
        description="The session's threads (its writers: the main loop, side calls, "
        "sub-agents, workers), the main thread first.",
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        threads = session_threads(session=session)
        return Response({"results": s.threads_out(threads)})


class EventDetailView(APIView):
    def _get(self, request: Request, session_id: str, event_id: str) -> Event:
        session = selectors.session_get(user=request.user, session_id=session_id)
        return selectors.event_get(session=session, event_id=event_id)

    @extend_schema(responses={200: s.EventOutSerializer, **errors(404)})
    def get(self, request: Request, session_id: str, event_id: str) -> Response:
        return Response(s.event_out([self._get(request, session_id, event_id)])[0])

    @extend_schema(
        request=s.EventPatchSerializer,
        responses={200: s.EventOutSerializer, **errors(*BODY, 404)},
    )
    def patch(self, request: Request, session_id: str, event_id: str) -> Response:
        event = self._get(request, session_id, event_id)
        body = s.EventPatchSerializer(data=_object(request.data))
        body.is_valid(raise_exception=True)
        event = services.event_set_pinned(event=event, pinned=body.validated_data["pinned"])
        return Response(s.event_out([event])[0])


class SessionUsageView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "thread",
                str,
                description="Whose context figures (contextTokens, percentUsed, nearLimit, "
                "atLimit): a thread's key; default: the main thread. The bill figures (tokens, "
                "cost, cache, calls) are always the whole session's.",
            )
        ],
        responses={200: s.UsageSerializer, **errors(404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        # The scope rule (sessions_app.scope): context figures of the thread asked for (the
        # main thread by default), the bill of the whole session.
        return Response(
            selectors.usage_for_session(session=session, thread=request.query_params.get("thread"))
        )


class TokenCountView(APIView):
    @extend_schema(
        request=s.TokenCountInSerializer,
        responses={200: s.TokenCountOutSerializer, **errors(*BODY)},
    )
    def post(self, request: Request) -> Response:
        body = s.TokenCountInSerializer(data=_object(request.data))
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if "model" in data:
            counter = tokens.counter_for_model(data["model"])
            native = tokens.resolve_encoding(data["model"]).native
        else:
            counter, native = tokens.get_counter(data["encoding"]), True
        if "text" in data:
            services.check_text(data["text"], "text")
            count = counter.count(data["text"])
        else:
            costs = [
                tokens.message_tokens(
                    counter,
                    role=m["role"],
                    content=m.get("content") or "",
                    name=str(m.get("name") or ""),
                )
                for m in data["messages"]
            ]
            count = tokens.context_tokens(costs)
        return Response(
            {"tokens": count, "encoding": counter.encoding, "exact": bool(counter.exact and native)}
        )


class ModelListView(APIView):
    @extend_schema(responses={200: s.ModelOutSerializer(many=True), **errors()})
    def get(self, request: Request) -> Response:
        return Response(
            [
                {"model": info.model, "contextLimit": info.context_limit, "encoding": info.encoding}
                for info in services.model_registry().all_models()
            ]
        )


def _object(data: Any) -> Any:
    if not isinstance(data, dict):
        raise InvalidInput(
            "body must be a JSON object",
            code="invalid_request",
            fields={"body": "must be an object"},
        )
    return data


_INTEGER = re.compile(r"-?[0-9]{1,30}")
_MAX_PARAM = 2**63 - 1


def int_param(
    request: Request, name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    """The integer query parameter `name` (`default` when absent), or 400 invalid_parameter."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # ASCII digits only (int() would also take " 5", "1_0" and other scripts' digits), and
    # within a database integer.
    if not _INTEGER.fullmatch(raw):
        raise InvalidInput(
            f"{name} must be an integer",
            code="invalid_parameter",
            fields={name: "must be an integer"},
        )
    value = int(raw)
    if maximum is None:
        maximum = _MAX_PARAM
    if not minimum <= value <= maximum:
        bound = f"between {minimum} and {maximum}"
        raise InvalidInput(
            f"{name} must be {bound}", code="invalid_parameter", fields={name: f"must be {bound}"}
        )
    return value


_int_param = int_param


def _bool_param(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidInput(
            f"{name} must be true or false",
            code="invalid_parameter",
            fields={name: "true or false"},
        )
    return raw in ("true", "1")
