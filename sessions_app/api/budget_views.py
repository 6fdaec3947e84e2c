"""The budgets API: spend limits on gateway calls (sessions_app.budgets). Staff set them for
any user (and any of the user's gateway client keys); a user reads their own."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from sessions_app import budgets
from sessions_app.api.openapi import BODY, PAGE_PARAMETERS, errors
from sessions_app.api.serializers import StrictCharField
from sessions_app.api.views import SessionPagination
from sessions_app.errors import InvalidInput
from sessions_app.models import BudgetPeriod

BUDGET_FIELDS: dict[str, serializers.Field] = {
    "id": serializers.UUIDField(),
    "user": serializers.CharField(help_text="The username the budget is for."),
    "clientKey": serializers.CharField(
        allow_null=True,
        help_text="The gateway client key (X-Ledger-Session) it limits; null: every call of "
        "the user.",
    ),
    "period": serializers.ChoiceField(choices=BudgetPeriod.values, help_text="UTC calendar."),
    "limitUsd": serializers.FloatField(),
    "spentUsd": serializers.FloatField(help_text="Settled spend in the current period."),
    "reservedUsd": serializers.FloatField(help_text="Estimates of the calls in flight."),
    "remainingUsd": serializers.FloatField(),
    "percentUsed": serializers.FloatField(allow_null=True),
    "exceeded": serializers.BooleanField(help_text="Calls are refused until periodEnd."),
    "periodStart": serializers.DateTimeField(),
    "periodEnd": serializers.DateTimeField(),
    "createdAt": serializers.DateTimeField(),
    "updatedAt": serializers.DateTimeField(),
}
BUDGET = inline_serializer("Budget", BUDGET_FIELDS)
BUDGET_PAGE = inline_serializer(
    "BudgetPage",
    {
        "count": serializers.IntegerField(),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": inline_serializer("BudgetItem", BUDGET_FIELDS, many=True),
    },
)


class BudgetCreateSerializer(serializers.Serializer):
    user = StrictCharField(max_length=150, help_text="Username of the user it limits.")
    clientKey = StrictCharField(
        required=False, allow_null=True, max_length=200, help_text="Omit: every call."
    )
    period = serializers.ChoiceField(choices=BudgetPeriod.values)
    limitUsd = serializers.DecimalField(max_digits=19, decimal_places=9, min_value=0)


class BudgetPatchSerializer(serializers.Serializer):
    period = serializers.ChoiceField(choices=BudgetPeriod.values, required=False)
    limitUsd = serializers.DecimalField(
        max_digits=19, decimal_places=9, min_value=0, required=False
    )


def _object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidInput("body must be a JSON object", fields={"body": "must be an object"})
    return data


def _staff(request: Request) -> None:
    if not getattr(request.user, "is_staff", False):
        raise PermissionDenied("only staff set budgets")


def _unknown(data: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise InvalidInput(
            "unknown fields: " + ", ".join(extra),
            fields={name: "not a budget field" for name in extra},
        )


class BudgetListView(APIView):
    @extend_schema(
        operation_id="budgets_list",
        parameters=PAGE_PARAMETERS,
        responses={200: BUDGET_PAGE, **errors(400, 404)},
    )
    def get(self, request: Request) -> Response:
        paginator = SessionPagination()
        page = paginator.paginate_queryset(
            budgets.budgets_visible_to(user=request.user), request, view=self
        )
        return paginator.get_paginated_response([budgets.budget_document(b) for b in page])

    @extend_schema(
        operation_id="budgets_create",
        request=BudgetCreateSerializer,
        responses={201: BUDGET, **errors(*BODY, 409)},
    )
    def post(self, request: Request) -> Response:
        _staff(request)
        data = _object(request.data)
        _unknown(data, set(BudgetCreateSerializer().fields))
        body = BudgetCreateSerializer(data=data)
        body.is_valid(raise_exception=True)
        values = body.validated_data
        budget = budgets.budget_create(
            user=values["user"],
            client_key=values.get("clientKey"),
            period=values["period"],
            limit_usd=values["limitUsd"],
            created_by=request.user,
        )
        return Response(budgets.budget_document(budget), status=status.HTTP_201_CREATED)


class BudgetDetailView(APIView):
    @extend_schema(operation_id="budgets_retrieve", responses={200: BUDGET, **errors(404)})
    def get(self, request: Request, budget_id: str) -> Response:
        return Response(
            budgets.budget_document(budgets.budget_get(user=request.user, budget_id=budget_id))
        )

    @extend_schema(
        operation_id="budgets_partial_update",
        request=BudgetPatchSerializer,
        responses={200: BUDGET, **errors(*BODY, 404)},
    )
    def patch(self, request: Request, budget_id: str) -> Response:
        budget = budgets.budget_get(user=request.user, budget_id=budget_id)
        _staff(request)
        data = _object(request.data)
        _unknown(data, set(BudgetPatchSerializer().fields))
        body = BudgetPatchSerializer(data=data)
        body.is_valid(raise_exception=True)
        budget = budgets.budget_update(
            budget=budget,
            period=body.validated_data.get("period"),
            limit_usd=body.validated_data.get("limitUsd"),
        )
        return Response(budgets.budget_document(budget))

    @extend_schema(operation_id="budgets_destroy", responses={204: None, **errors(404)})
    def delete(self, request: Request, budget_id: str) -> Response:
        budget = budgets.budget_get(user=request.user, budget_id=budget_id)
        _staff(request)
        budgets.budget_delete(budget=budget)
        return Response(status=status.HTTP_204_NO_CONTENT)
