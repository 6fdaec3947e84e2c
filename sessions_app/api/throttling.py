from __future__ import annotations

import logging

from django.conf import settings
from redis.exceptions import RedisError
from rest_framework.throttling import UserRateThrottle as BaseUserRateThrottle

logger = logging.getLogger("sessions_app.throttling")


class UserRateThrottle(BaseUserRateThrottle):
    """Per-user rate limit; the rate is read from settings at request time so it can be
    changed (or turned off with "off") without re-importing DRF's settings.

    The counters live in the cache (Redis in production). When the cache is unreachable the
    throttle fails open with a warning: a rate limit is not worth turning every read into a 500
    during a Redis outage."""

    def get_rate(self) -> str | None:
        rate = settings.API_THROTTLE_RATE
        return None if rate.lower() == "off" else rate

    def allow_request(self, request, view):  # type: ignore[no-untyped-def]
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            return super().allow_request(request, view)
        except (RedisError, OSError) as exc:
            logger.warning("rate limit not applied, the cache is unreachable: %s", exc)
            return True
