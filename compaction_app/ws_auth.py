"""Websocket authentication by `?token=` (the session cookie is handled by AuthMiddlewareStack)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.contrib.auth.models import AnonymousUser


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    from rest_framework.authtoken.models import Token

    try:
        token = Token.objects.select_related("user").get(key=key)
    except Token.DoesNotExist:
        return None
    return token.user if token.user.is_active else None


class TokenAuthMiddleware(BaseMiddleware):
    """A `?token=` query parameter authenticates the connection; without it the cookie
    session user (set by AuthMiddlewareStack) stays. A bad token leaves the user anonymous."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        keys = query.get("token")
        if keys:
            user = await _user_for_token(keys[0])
            scope = dict(scope, user=user or AnonymousUser())
        return await super().__call__(scope, receive, send)
