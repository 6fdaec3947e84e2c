"""`GET /calls/{id}`: one gateway call's story (compaction_app.call_story)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compaction_app.call_story import call_story_document
from sessions_app.api.openapi import errors


class CallDetailView(APIView):
    @extend_schema(
        operation_id="calls_retrieve",
        responses={
            200: OpenApiResponse(
                description="The call as in the calls list, plus its story: the request as "
                "sent and as forwarded (each message's fate: kept, summarized, cleared, "
                "pruned), the summaries forwarded, the reply, masked headers, usage and cost "
                "by kind, the latency split, the context before and after, the compaction "
                "run it triggered and its neighbouring calls."
            ),
            **errors(404),
        },
    )
    def get(self, request: Request, call_id: str) -> Response:
        _, story = call_story_document(user=request.user, call_id=call_id)
        return Response(story)
