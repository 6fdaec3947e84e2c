"""Websocket authentication: `?token=`, or the session cookie (read by AuthMiddlewareStack)
from a same-site page.

Cross-site websocket hijacking needs a browser that attaches its cookie to a socket another
site opens, so the Origin check applies to cookie-authenticated connections only. A token is
a credential the client had to present itself: a token connection is accepted with any Origin
or none (Python agents send none). Refusals accept first and then close with the design's
code (4401 / 4403), so every client sees a close code rather than a bare HTTP 403.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from compaction_app.realtime.revocation import CLOSE_FORBIDDEN, SCOPE_TOKEN


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    from rest_framework.authtoken.models import Token

    try:
        token = Token.objects.select_related("user").get(key=key)
    except Token.DoesNotExist:
        return None
    return token.user if token.user.is_active else None


def same_site_origin(scope: dict[str, Any]) -> bool:
    """Whether the handshake's Origin names one of ALLOWED_HOSTS (a missing Origin does not:
    a browser always sends one)."""
    origin = None
    for name, value in scope.get("headers", []):
        if name == b"origin":
            try:
                origin = urlparse(value.decode("latin-1"))
            except ValueError:
                return False
    if origin is None:
        return False
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = ["localhost", "127.0.0.1", "[::1]"]
    return OriginValidator(None, allowed).valid_origin(origin)


async def close_after_accept(receive: Any, send: Any, code: int) -> None:
    """Answer the handshake with accept, then close with `code`."""
    message = await receive()
    if message.get("type") != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code})


class TokenAuthMiddleware(BaseMiddleware):
    """A `?token=` query parameter authenticates the connection (a bad token leaves it
    anonymous, which the consumers close with 4401). Without one, the cookie session user set
    by AuthMiddlewareStack stays, provided the Origin is same-site; otherwise 4403."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        keys = query.get("token")
        if keys:
            user = await _user_for_token(keys[0])
            scope = dict(scope, user=user or AnonymousUser())
            if user is not None:
                scope[SCOPE_TOKEN] = keys[0]  # its deletion closes the socket (revocation.py)
        else:
            user = scope.get("user")
            if user is not None and user.is_authenticated and not same_site_origin(scope):
                return await close_after_accept(receive, send, CLOSE_FORBIDDEN)
        return await super().__call__(scope, receive, send)
