"""Revoked credentials close their websockets (close code 4401), and so do lost permissions
(4403).

A socket is authenticated once, at its handshake; without this it would outlive the
credential that opened it. Two ways close it:

- The fast path, signals of this process (and, on the production profile, of every process
  sharing the Redis channel layer). Each consumer joins, besides its broadcast groups, one
  group per credential it depends on (`revocation_groups`):
  - its user's (`ledger.auth.user.<id>`): the user is deactivated or deleted (closed at once),
    or changed otherwise (demoted from staff, a new password: each socket re-checks at once);
  - a token socket, its token's (`ledger.auth.token.<digest>`): the token is deleted, which is
    also how a DRF token is rotated (one token per user: a new key means the old row goes);
  - a cookie socket, its login session's (`ledger.auth.login.<digest>`): that session logs out.
  The receivers below send `auth.revoked` or `auth.recheck` to the group once the change
  commits. Groups are named by digests so no credential appears in the channel layer.
- The periodic re-check, for what no signal reaches this process with (a shell or the admin
  of another process on the embedded profile, whose channel layer is in-process memory; SQL):
  every `WS_AUTH_RECHECK_SECONDS` an open socket looks its credential up again (the token row,
  or the login session and Django's session auth hash, which a new password changes) and asks
  its consumer whether the user, as stored now, may still receive what it sends
  (`still_permitted`: a staff feed of every session needs staff).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from importlib import import_module
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib import auth
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import HttpRequest
from rest_framework.authtoken.models import Token

logger = logging.getLogger("compaction_app.revocation")

CLOSE_REVOKED = 4401
CLOSE_FORBIDDEN = 4403
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


def current_user(scope: dict[str, Any]) -> Any:
    """The socket's user as stored now, if the credential that opened the socket still
    authenticates it (and the user is active); otherwise None. Queries the database."""
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return None
    key = scope.get(SCOPE_TOKEN)
    if key:
        token = Token.objects.select_related("user").filter(key=key).first()
        current = token.user if token is not None else None
    else:
        current = _login_user(scope)
    if current is None or current.pk != user.pk or not current.is_active:
        return None
    return current


def _login_user(scope: dict[str, Any]) -> Any:
    session_key = getattr(scope.get("session"), "session_key", None)
    if not session_key:
        return None
    # Django's own check, as on every HTTP request: the login session exists, has not expired,
    # and carries the user's current session auth hash (a new password changes it). Like an
    # HTTP request, a session whose hash no longer matches is flushed.
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(request)
    return user if user.is_authenticated else None


class RevocableConsumerMixin:
    """For a websocket consumer: join `revocation_groups` with the others, close on revocation,
    and once accepted (`start_rechecks`) re-check the credential and permissions periodically."""

    scope: dict[str, Any]
    _rechecks: asyncio.Task[None] | None = None
    _closed_for_auth = False

    def revocation_groups(self) -> list[str]:
        return revocation_groups(self.scope)

    def still_permitted(self, user: Any) -> bool:
        """Whether `user`, as stored now, may still receive what this socket sends. Runs in a
        worker thread (may query the database)."""
        return True

    def start_rechecks(self) -> None:
        interval = float(settings.WS_AUTH_RECHECK_SECONDS)
        self._rechecks = asyncio.get_running_loop().create_task(self._recheck_every(interval))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)  # type: ignore[misc]
        finally:
            # However the consumer ends (disconnect, cancellation), its timer ends with it.
            task, self._rechecks = self._rechecks, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _recheck_every(self, interval: float) -> None:
        # The first check at a random point of the interval: sockets opened together (a
        # server restart reconnects them all) do not query together ever after.
        await asyncio.sleep(random.uniform(0.5, 1.0) * interval)  # noqa: S311 - not a secret
        while True:
            try:
                if not await self.recheck():
                    return
            except Exception:
                # The database is unreachable, say: keep the socket, try again next time.
                logger.warning("could not re-check a websocket's credential", exc_info=True)
            await asyncio.sleep(interval)

    async def recheck(self) -> bool:
        """Close the socket if its credential (4401) or its permission (4403) is gone; whether
        it stays open."""
        if self._closed_for_auth:
            return False
        code = await database_sync_to_async(self._recheck_code)()
        if code is not None:
            await self._close_for_auth(code)
        return code is None

    def _recheck_code(self) -> int | None:
        user = current_user(self.scope)
        if user is None:
            return CLOSE_REVOKED
        if not self.still_permitted(user):
            return CLOSE_FORBIDDEN
        return None

    async def _close_for_auth(self, code: int) -> None:
        if not self._closed_for_auth:
            self._closed_for_auth = True
            await self.close(code=code)  # type: ignore[attr-defined]

    async def auth_revoked(self, event: dict[str, Any]) -> None:
        await self._close_for_auth(CLOSE_REVOKED)

    async def auth_recheck(self, event: dict[str, Any]) -> None:
        try:
            await self.recheck()
        except Exception:
            # As in the periodic check: the socket stays, the next check decides.
            logger.warning("could not re-check a websocket's credential", exc_info=True)


def _send(group: str, kind: str) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": kind}
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:
            logger.exception("could not tell the sockets of a credential about a change")
        return
    # Called on an event loop (an async view): send from it without blocking.
    task = asyncio.get_running_loop().create_task(layer.group_send(group, message))
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


def revoke(group: str) -> None:
    """Close the group's sockets once the current transaction commits (now outside one)."""
    transaction.on_commit(lambda: _send(group, "auth.revoked"))


def recheck(group: str) -> None:
    """Have the group's sockets re-check their credential and permissions once the current
    transaction commits (now outside one)."""
    transaction.on_commit(lambda: _send(group, "auth.recheck"))


@receiver(post_delete, sender=Token, dispatch_uid="ledger-revoke-token")
def _token_deleted(sender: Any, instance: Token, **kwargs: Any) -> None:
    revoke(token_group(instance.key))


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="ledger-revoke-inactive-user")
def _user_saved(
    sender: Any, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any
) -> None:
    if created:
        return
    if not instance.is_active:
        revoke(user_group(instance.pk))
    elif update_fields is None or set(update_fields) - {"last_login"}:
        # Demoted from staff, a new password...: each socket decides (a login's own save of
        # last_login changes nothing a socket depends on).
        recheck(user_group(instance.pk))


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
