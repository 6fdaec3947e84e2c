"""Revoked credentials close their websockets (close code 4401) within seconds.

A socket is authenticated once, at its handshake; without this it would outlive the
credential that opened it. Each consumer joins, besides its broadcast groups, one group per
credential it depends on (`revocation_groups`):
- its user's (`ledger.auth.user.<id>`): the user is deactivated or deleted;
- a token socket, its token's (`ledger.auth.token.<digest>`): the token is deleted, which is
  also how a DRF token is rotated (one token per user: a new key means the old row goes);
- a cookie socket, its login session's (`ledger.auth.login.<digest>`): that session logs out.
The receivers below send `auth.revoked` to the group once the change commits; the consumer
(`RevocableConsumerMixin.auth_revoked`) closes with 4401. Groups are named by digests so no
credential appears in the channel layer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from rest_framework.authtoken.models import Token

logger = logging.getLogger("compaction_app.revocation")

CLOSE_REVOKED = 4401
# Set on the websocket scope by TokenAuthMiddleware when a token authenticated it.
SCOPE_TOKEN = "ledger_token_key"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:32]


def user_group(user_id: Any) -> str:
    return f"ledger.auth.user.{user_id}"


def token_group(key: str) -> str:
    return f"ledger.auth.token.{_digest(key)}"


def login_group(session_key: str) -> str:
    return f"ledger.auth.login.{_digest(session_key)}"


def revocation_groups(scope: dict[str, Any]) -> list[str]:
    """The groups whose revocation closes a socket with this (authenticated) scope."""
    user = scope.get("user")
    groups = [user_group(user.pk)] if user is not None and user.is_authenticated else []
    key = scope.get(SCOPE_TOKEN)
    if key:
        groups.append(token_group(key))
    else:
        session = scope.get("session")
        session_key = getattr(session, "session_key", None)
        if session_key:
            groups.append(login_group(session_key))
    return groups


class RevocableConsumerMixin:
    """For a websocket consumer: join `revocation_groups` with the others, close on revocation."""

    scope: dict[str, Any]

    def revocation_groups(self) -> list[str]:
        return revocation_groups(self.scope)

    async def auth_revoked(self, event: dict[str, Any]) -> None:
        await self.close(code=CLOSE_REVOKED)  # type: ignore[attr-defined]


def _send(group: str) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "auth.revoked"}
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:
            logger.exception("could not close the sockets of a revoked credential")
        return
    # Called on an event loop (an async view): send from it without blocking.
    task = asyncio.get_running_loop().create_task(layer.group_send(group, message))
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


def revoke(group: str) -> None:
    """Close the group's sockets once the current transaction commits (now outside one)."""
    transaction.on_commit(lambda: _send(group))


@receiver(post_delete, sender=Token, dispatch_uid="ledger-revoke-token")
def _token_deleted(sender: Any, instance: Token, **kwargs: Any) -> None:
    revoke(token_group(instance.key))


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="ledger-revoke-inactive-user")
def _user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if not created and not instance.is_active:
        revoke(user_group(instance.pk))


@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="ledger-revoke-deleted-user")
def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    revoke(user_group(instance.pk))


@receiver(user_logged_out, dispatch_uid="ledger-revoke-logout")
def _logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    if session_key:
        revoke(login_group(session_key))
    elif user is not None:
        revoke(user_group(user.pk))
