from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import UserRateThrottle as BaseUserRateThrottle


class UserRateThrottle(BaseUserRateThrottle):
    """Per-user rate limit; the rate is read from settings at request time so it can be
    changed (or turned off with "off") without re-importing DRF's settings."""

    def get_rate(self) -> str | None:
        rate = settings.API_THROTTLE_RATE
        return None if rate.lower() == "off" else rate

    def allow_request(self, request, view):  # type: ignore[no-untyped-def]
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)
