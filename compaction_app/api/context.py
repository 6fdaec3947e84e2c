"""The REST `/context` view (GET and POST /sessions/{id}/context): the messages a client
should send next, fitted by the fitting core (compaction_app/fitting.py).

It lives on the compaction side because POST may compact at the hard limit: sessions_app
never imports compaction_app, and the view calls the core directly rather than through a
signal or a hook. Its URL is routed in compaction_app/api/urls.py.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import APISettings
from rest_framework.views import APIView

from compaction_app import fitting
from compaction_app.api.serializers import run_to_dict
from sessions_app import recall, selectors
from sessions_app.api import serializers as s
from sessions_app.api.openapi import errors, integer
from sessions_app.api.views import int_param
from sessions_app.errors import InvalidInput
from sessions_app.heavy import heavy_slot


class _FormatParamIsOurs(DefaultContentNegotiation):
    """`?format=` is /context's own parameter (openai|anthropic); DRF would otherwise read it
    as a renderer override and answer 404 for any value but "json"."""

    settings = APISettings(user_settings={"URL_FORMAT_OVERRIDE": None})  # type: ignore[assignment,arg-type]


_CONTEXT_PARAMETERS = [
    OpenApiParameter("maxTokens", integer(1), description="At least 1."),
    OpenApiParameter("reserveTokens", integer(0), description="At least 0."),
    OpenApiParameter("format", str, enum=["openai", "anthropic"]),
]


class SessionContextView(APIView):
    content_negotiation_class = _FormatParamIsOurs

    @extend_schema(
        parameters=_CONTEXT_PARAMETERS,
        responses={200: s.ContextSerializer, **errors(400, 404, 422)},
        description="The messages to send next. Never writes: past the compact threshold it "
        "answers a pruned view with compactionRecommended: true.",
    )
    def get(self, request: Request, session_id: str) -> Response:
        return self._answer(request, session_id, compact=False)

    @extend_schema(
        operation_id="sessions_context_compact",
        request=None,
        parameters=_CONTEXT_PARAMETERS,
        responses={200: s.ContextSerializer, **errors(400, 403, 404, 409, 422)},
        description="The same answer as GET, but at the hard limit a synchronous compaction "
        "runs first (at most one per cooldownSeconds; within it the view is pruned).",
    )
    def post(self, request: Request, session_id: str) -> Response:
        return self._answer(request, session_id, compact=True)

    def _answer(self, request: Request, session_id: str, *, compact: bool) -> Response:
        session = selectors.session_get(user=request.user, session_id=session_id)
        with heavy_slot(user_id=request.user.pk):
            return self._fitted(request, session, compact=compact)

    def _fitted(self, request: Request, session: Any, *, compact: bool) -> Response:
        max_tokens = int_param(request, "maxTokens", 0, minimum=1) or None
        reserve = int_param(request, "reserveTokens", 0, minimum=0)
        fmt = request.query_params.get("format", "openai")
        if fmt not in ("openai", "anthropic"):
            raise InvalidInput(
                "format must be openai or anthropic", fields={"format": "openai or anthropic"}
            )
        prepared = fitting.fit_context(
            session=session,
            user=request.user,
            max_tokens=max_tokens,
            reserve_tokens=reserve,
            fmt=fmt,
            compact=compact,
            respect_cooldown=compact,
        )
        payload: dict[str, Any] = {
            "messages": prepared.messages,
            "tokenCount": prepared.token_count,
            "limit": prepared.limit,
            "pruned": prepared.pruned,
            "summary": prepared.summary,
            "compactionRecommended": prepared.compaction_recommended,
        }
        if fmt == "anthropic":
            payload["system"] = prepared.system
        if prepared.run is not None:
            payload["compaction"] = run_to_dict(prepared.run.run)
        # Once some originals are out of the context, the model may ask for them back.
        if recall.session_has_recallable(session=session):
            payload["tools"] = [recall.recall_tool(fmt=fmt)]
        return Response(payload)
