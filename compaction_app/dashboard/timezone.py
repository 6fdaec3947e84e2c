"""The viewer's time zone on the dashboard: the `ledger_tz` cookie (set by
static/js/timezone.js from the browser's own zone, or `?tz=` on a page) activates that zone
for the request, so every time a template shows is the viewer's. An unknown zone is UTC."""

from __future__ import annotations

from collections.abc import Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

COOKIE = "ledger_tz"


def zone_of(raw: str | None) -> ZoneInfo | None:
    if not raw or len(raw) > 64 or raw.startswith("/") or ".." in raw:
        return None
    try:
        return ZoneInfo(raw)
    except (ValueError, ZoneInfoNotFoundError):
        return None


def viewer_zone(request: HttpRequest) -> ZoneInfo:
    return zone_of(request.GET.get("tz")) or zone_of(request.COOKIES.get(COOKIE)) or ZoneInfo("UTC")


class ViewerTimezoneMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(("/gateway/", "/api/", "/mcp", "/metrics")):
            return self.get_response(request)
        timezone.activate(viewer_zone(request))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
