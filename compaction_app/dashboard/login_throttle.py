"""Failed logins are throttled per username and per client address.

Counters live in the cache (Redis on the production profile, the process's memory on the
embedded one, which is a single process), so the throttle works on both profiles without a
table. Each failed password login (Django's `user_login_failed`, for the dashboard's and the
admin's login forms alike) counts against the username (case-insensitive) and the client
address for `LOGIN_THROTTLE_WINDOW_SECONDS` from the first failure. Once either count reaches
its limit (`LOGIN_THROTTLE_USERNAME_FAILURES`, `LOGIN_THROTTLE_ADDRESS_FAILURES`), further login
POSTs for it are answered 429 with `Retry-After` before any password is checked, the right
password included: a lockout, not a hint. A successful login clears its username's count.
Failures are logged with the username and address, never the password. When the cache is
unreachable the throttle fails open with a warning, as the API's rate limit does.

The client address is REMOTE_ADDR: behind a proxy, have the proxy set it (the ASGI server's
proxy-headers option), or every client shares the proxy's address.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from redis.exceptions import RedisError

logger = logging.getLogger("compaction_app.login")

_LOGIN_URL_NAMES = ("login", "admin:login")


def _key(kind: str, value: str) -> str:
    return f"login-failures:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:32]}"


def _username_key(username: str) -> str:
    return _key("user", username.strip().lower())


def _address_key(request: HttpRequest) -> str:
    return _key("addr", str(request.META.get("REMOTE_ADDR") or "unknown"))


def _login_paths() -> set[str]:
    return {reverse(name) for name in _LOGIN_URL_NAMES}


def _count(key: str) -> int:
    return int(cache.get(key) or 0)


def _lockout(request: HttpRequest) -> HttpResponse | None:
    username = str(request.POST.get("username") or "")
    checks = [(_address_key(request), int(settings.LOGIN_THROTTLE_ADDRESS_FAILURES))]
    if username:
        checks.append((_username_key(username), int(settings.LOGIN_THROTTLE_USERNAME_FAILURES)))
    try:
        locked = any(_count(key) >= limit for key, limit in checks)
    except (RedisError, OSError) as exc:
        logger.warning("login throttle not applied, the cache is unreachable: %s", exc)
        return None
    if not locked:
        return None
    window = int(settings.LOGIN_THROTTLE_WINDOW_SECONDS)
    logger.warning(
        "login refused: too many failed logins for username %r or address %s",
        username,
        request.META.get("REMOTE_ADDR"),
    )
    response = HttpResponse(
        "<!doctype html><title>Too many login attempts</title>"
        "<h1>Too many failed login attempts</h1>"
        f"<p>Logins for this account or from this address are locked for up to "
        f"{max(window // 60, 1)} minutes. Try again later.</p>",
        status=429,
        content_type="text/html; charset=utf-8",
    )
    response["Retry-After"] = str(window)
    return response


class LoginThrottleMiddleware:
    """Answer a login POST 429 while its username or address is locked out.

    Sync and async capable: under ASGI a sync-only middleware would put every request of the
    site (the API's included) through two extra thread hops; only a login POST touches the
    cache."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.paths: set[str] | None = None
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _is_login(self, request: HttpRequest) -> bool:
        if request.method != "POST":
            return False
        if self.paths is None:
            self.paths = _login_paths()
        return request.path in self.paths

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        if self._is_login(request):
            refused = _lockout(request)
            if refused is not None:
                return refused
        return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> Any:
        if self._is_login(request):
            refused = await sync_to_async(_lockout)(request)
            if refused is not None:
                return refused
        return await self.get_response(request)


def _bump(key: str, window: int) -> int:
    cache.add(key, 0, timeout=window)
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=window)
        return 1


@receiver(user_login_failed, dispatch_uid="ledger-login-throttle-failed")
def _login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    if request is None:
        return  # not a login form (a script calling authenticate())
    username = str(credentials.get("username") or "")
    window = int(settings.LOGIN_THROTTLE_WINDOW_SECONDS)
    try:
        by_address = _bump(_address_key(request), window)
        by_username = _bump(_username_key(username), window) if username else 0
    except (RedisError, OSError) as exc:
        logger.warning("login failure not counted, the cache is unreachable: %s", exc)
        return
    # Django hands the credentials over with the password already masked; only the
    # username and the address are logged.
    logger.warning(
        "failed login for username %r from %s (%d for the username, %d from the address)",
        username,
        request.META.get("REMOTE_ADDR"),
        by_username,
        by_address,
    )


@receiver(user_logged_in, dispatch_uid="ledger-login-throttle-success")
def _logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if request is None:
        return
    with contextlib.suppress(RedisError, OSError):
        cache.delete(_username_key(user.get_username()))
