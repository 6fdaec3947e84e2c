"""Compaction endpoints: validate, call one service, serialise."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from compaction_app import selectors, services, thread_scope
from compaction_app.api import serializers as s
from compaction_app.models import Trigger
from sessions_app.api.openapi import BODY, PAGE_PARAMETERS, errors, page_of
from sessions_app.api.views import SessionPagination, _object
from sessions_app.heavy import heavy_slot
from sessions_app.selectors import session_get

CompactionPage = page_of("CompactionPage", s.CompactionSerializer)


class SessionCompactionsView(APIView):
    @extend_schema(
        operation_id="sessions_compactions_list",
        parameters=PAGE_PARAMETERS,
        responses={200: CompactionPage, **errors(400, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = session_get(user=request.user, session_id=session_id)
        paginator = SessionPagination()
        page = paginator.paginate_queryset(
            selectors.runs_for_session(session=session), request, view=self
        )
        return paginator.get_paginated_response([s.run_to_dict(run) for run in page or []])

    @extend_schema(
        request=s.CompactionRequestSerializer,
        responses={
            202: OpenApiResponse(s.CompactionSerializer, description="The run, pending."),
            200: OpenApiResponse(s.PlanSerializer, description="dryRun: the plan, nothing done."),
            **errors(*BODY, 404, 409, 503),
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = session_get(user=request.user, session_id=session_id)
        body = s.CompactionRequestSerializer(data=_object(request.data))
        body.is_valid(raise_exception=True)
        data = body.validated_data
        thread = thread_scope.requested_thread(session=session, key=data.get("thread"))
        if data.get("dryRun"):
            with heavy_slot(user_id=request.user.pk):
                dry = services.compaction_plan(
                    session=session,
                    strategy=data.get("strategy"),
                    summarizer=data.get("summarizer"),
                    target_ratio=data.get("targetRatio"),
                    thread=thread,
                    project=True,
                )
            return Response(s.dry_run_to_dict(dry))
        run = services.compaction_request(
            session=session,
            user=request.user,
            trigger=Trigger.MANUAL,
            strategy=data.get("strategy"),
            summarizer=data.get("summarizer"),
            target_ratio=data.get("targetRatio"),
            thread=thread,
        )
        return Response(s.run_to_dict(run), status=status.HTTP_202_ACCEPTED)


class CompactionDetailView(APIView):
    @extend_schema(responses={200: s.CompactionSerializer, **errors(404)})
    def get(self, request: Request, compaction_id: str) -> Response:
        return Response(s.run_to_dict(selectors.run_get(user=request.user, run_id=compaction_id)))


class CompactionRevertView(APIView):
    @extend_schema(request=None, responses={200: s.CompactionSerializer, **errors(404, 409)})
    def post(self, request: Request, compaction_id: str) -> Response:
        run = selectors.run_get(user=request.user, run_id=compaction_id)
        return Response(s.run_to_dict(services.compaction_revert(run=run)))


class SessionSummaryView(APIView):
    @extend_schema(responses={200: s.RunningSummarySerializer, **errors(404)})
    def get(self, request: Request, session_id: str) -> Response:
        session = session_get(user=request.user, session_id=session_id)
        return Response(
            s.summary_to_dict(
                selectors.running_summary_get(session=session),
                message_tokens=selectors.summary_message_tokens(session=session),
            )
        )
