"""GET /api/v1/: the API root, a map of the endpoints for someone exploring with curl.

Public on purpose: it lists links only (the same paths the OpenAPI schema publishes), no data,
so a newcomer without a token yet learns where to go; every endpoint it names keeps its own
authentication.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compaction_app.gateway import providers
from sessions_app.api.openapi import errors

# Relative to /api/v1/; `{session_id}` and `{compaction_id}` are placeholders, spelled as in the schema.
ENDPOINTS = {
    "sessions": "sessions",
    "session": "sessions/{session_id}",
    "events": "sessions/{session_id}/events",
    "usage": "sessions/{session_id}/usage",
    "context": "sessions/{session_id}/context",
    "compactions": "sessions/{session_id}/compactions",
    "summary": "sessions/{session_id}/summary",
    "sessionSearch": "sessions/{session_id}/search",
    "recall": "sessions/{session_id}/recall",
    "sessionCalls": "sessions/{session_id}/calls",
    "compaction": "compactions/{compaction_id}",
    "compactionRevert": "compactions/{compaction_id}/revert",
    "search": "search",
    "calls": "calls",
    "budgets": "budgets",
    "budget": "budgets/{budget_id}",
    "models": "models",
    "tokenCount": "tokens/count",
}


class ApiRootView(APIView):
    permission_classes = [AllowAny]
    # No token needed, so no throttle key either; the answer is constant.
    throttle_classes: list = []

    @extend_schema(
        summary="The API root: links to every endpoint, the schema and the docs",
        auth=[],
        responses={
            200: inline_serializer(
                "ApiRoot",
                {
                    "version": serializers.CharField(),
                    "endpoints": serializers.DictField(child=serializers.CharField()),
                    "schema": serializers.CharField(),
                    "docs": serializers.CharField(),
                    "gateway": serializers.DictField(child=serializers.CharField()),
                    "authentication": serializers.CharField(),
                },
            ),
            # A token that is sent is checked, even here (an invalid one is a 401).
            **errors(401, 406, common=False),
        },
    )
    def get(self, request: Request) -> Response:
        base = request.build_absolute_uri("/api/v1/")
        root = request.build_absolute_uri("/")
        return Response(
            {
                "version": "v1",
                "endpoints": {name: base + path for name, path in ENDPOINTS.items()},
                "schema": base + "schema/",
                "docs": base + "docs/",
                # Each provider's base URL (the registry's prefixes).
                "gateway": {
                    name: root + "gateway/" + prefix for name, prefix in providers.bases().items()
                },
                "authentication": "Authorization: Token <your API token> (every endpoint but "
                "this one)",
            }
        )
