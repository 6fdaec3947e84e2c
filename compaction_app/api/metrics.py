"""`/metrics`: Prometheus' text format (compaction_app.metrics), for a scraper holding
`METRICS_TOKEN` (`Authorization: Bearer …`) or a staff user (an API token, `Authorization:
Token …`, or a signed-in staff browser). Anyone else: 401, or 403 when signed in without
staff rights."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from rest_framework.authtoken.models import Token

from compaction_app import metrics


def _allowed(request: HttpRequest) -> int:
    """200 when the caller may read the metrics, else the status to answer."""
    header = request.headers.get("Authorization") or ""
    scheme, _, credential = header.partition(" ")
    credential = credential.strip()
    expected = settings.METRICS_TOKEN
    if scheme.lower() == "bearer" and expected and credential:
        return 200 if hmac.compare_digest(credential.encode(), expected.encode()) else 401
    if scheme.lower() == "token" and credential:
        token = Token.objects.select_related("user").filter(key=credential).first()
        if token is None or not token.user.is_active:
            return 401
        return 200 if token.user.is_staff else 403
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return 200 if user.is_staff else 403
    return 401


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    status = _allowed(request)
    if status != 200:
        response = JsonResponse(
            {
                "error": "not_authenticated" if status == 401 else "permission_denied",
                "detail": "/metrics needs METRICS_TOKEN (Bearer) or a staff user's API token",
            },
            status=status,
        )
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)
