"""`GET /calls/{id}`: one gateway call's story (compaction_app.call_story)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compaction_app.call_story import call_story_document
from sessions_app.api.call_views import CALL_FIELDS
from sessions_app.api.openapi import errors

# The call as the list shows it, plus its story (docs/api.md, "A call's story"). The story's
# parts are objects whose keys are documented there: stated as objects here, not as schemas
# of their own, so a part that gains a key does not break clients that validate.
CALL_STORY = inline_serializer(
    "CallStory",
    {
        **CALL_FIELDS,
        "usage": serializers.DictField(
            help_text="In place of the list's reported / absent: tokens and costUsd by kind "
            "(input, cacheRead, cacheWrite, output; costUsd.total is the call's billed cost) "
            "and cacheHitRate."
        ),
        "sessionTitle": serializers.CharField(allow_blank=True),
        "gatewayMs": serializers.IntegerField(
            allow_null=True, help_text="From arrival to the first send upstream."
        ),
        "latency": serializers.DictField(
            help_text="gatewayMs, providerFirstByteMs, afterFirstByteMs, ttfbMs, totalMs."
        ),
        "headers": serializers.DictField(
            help_text="request and response: an allowlist, every credential masked."
        ),
        "fit": serializers.DictField(help_text="What fitting did to this call."),
        "context": serializers.DictField(
            allow_null=True,
            help_text="sentTokens, forwardedTokens, limit, both as …Percent, and how; null for "
            "a call without a session.",
        ),
        "request": serializers.DictField(
            help_text="known, messages (each with its fate: kept, summarized, cleared, "
            "pruned), summaries, unmapped, notes."
        ),
        "reply": serializers.ListField(
            child=serializers.DictField(), help_text="The reply's events."
        ),
        "neighbours": serializers.DictField(
            help_text="previous, next, previousInThread, nextInThread: call ids or null."
        ),
        "forwardedAt": serializers.DateTimeField(),
        "compaction": serializers.DictField(
            allow_null=True,
            help_text="The run the call triggered while fitting (as GET /compactions/{id}).",
        ),
        "runs": serializers.ListField(
            child=serializers.DictField(),
            help_text="The compaction runs in effect for the call: {markerId, compactionId}.",
        ),
    },
)


class CallDetailView(APIView):
    @extend_schema(
        operation_id="calls_retrieve",
        responses={
            200: OpenApiResponse(
                CALL_STORY,
                description="The call as in the calls list, plus its story: the request as "
                "sent and as forwarded (each message's fate: kept, summarized, cleared, "
                "pruned), the summaries forwarded, the reply, masked headers, usage and cost "
                "by kind, the latency split, the context before and after, the compaction "
                "run it triggered and its neighbouring calls.",
            ),
            **errors(404),
        },
    )
    def get(self, request: Request, call_id: str) -> Response:
        _, story = call_story_document(user=request.user, call_id=call_id)
        return Response(story)
