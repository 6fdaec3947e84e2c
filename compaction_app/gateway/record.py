"""Gateway services (sync, ORM): who is calling, which session, which of the resent messages
are new, and the reply.

Matching is O(new messages): the session remembers how many of the client's messages the
ledger holds and the hash of the last one. When the next request still has that message at
that position, everything after it is new and nothing before it is hashed. Otherwise (a
client that edited its history, a retry, concurrent clients) the full request is matched
against the stored hashes once.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, connection, transaction
from django.utils.functional import SimpleLazyObject
from rest_framework.authtoken.models import Token

from compaction_app.gateway.messages import (
    ClientMessage,
    GatewayError,
    Reply,
    event_id,
    message_hash,
)
from sessions_app import raw_rows, tokens
from sessions_app.errors import Conflict, LedgerError
from sessions_app.models import ROLE_FOR_TYPE, Event, Session
from sessions_app.pricing import saved_tokens
from sessions_app.services import EventInput, TokenUsage, event_append, session_create

logger = logging.getLogger("compaction_app.gateway")

MAX_CLIENT_KEY = 200

Converter = Callable[[int], ClientMessage]


def authenticate(key: str | None) -> AbstractBaseUser:
    """The user whose API token is `key` (401 otherwise)."""
    if not key:
        raise GatewayError("X-Ledger-Key header is required", status=401, code="invalid_api_key")
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        raise GatewayError(
            "X-Ledger-Key is not a valid API token", status=401, code="invalid_api_key"
        )
    return token.user


def resolve_session(*, user: AbstractBaseUser, header: str | None, model: str) -> Session:
    """The session named by `X-Ledger-Session`: a session id of this user, or a client key
    (any string up to 200 characters) that gets or creates the user's session for `model`.
    Another user's session id is a 404, as if it did not exist."""
    key = (header or "").strip()
    if not key:
        raise GatewayError(
            "X-Ledger-Session header is required (a session id or your own thread id)",
            code="missing_session",
        )
    if len(key) > MAX_CLIENT_KEY:
        raise GatewayError(
            f"X-Ledger-Session must be at most {MAX_CLIENT_KEY} characters", code="invalid_session"
        )
    try:
        session_id: uuid.UUID | None = uuid.UUID(key)
    except ValueError:
        session_id = None
    if session_id is not None:
        session = Session.objects.filter(pk=session_id).first()
        if session is not None:
            if session.owner_id != user.pk:
                raise GatewayError("session not found", status=404, code="session_not_found")
            return session
    existing = Session.objects.filter(owner_id=user.pk, client_key=key).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return session_create(owner=user, model=model, title=key[:200], client_key=key)
    except IntegrityError:
        # Two first requests of one thread raced; the other one created it.
        return Session.objects.get(owner_id=user.pk, client_key=key)
    except LedgerError as exc:
        raise GatewayError(exc.detail, code=exc.code, param="model") from None


def caller_and_session(
    *, key: str | None, header: str | None, model: str
) -> tuple[AbstractBaseUser, Session]:
    """`authenticate` and `resolve_session` in one query when the session exists (every call
    but a thread's first); anything else takes the two steps, with their errors. The user is
    then loaded only if something asks for more than its id (a compaction records who asked)."""
    name = (header or "").strip()
    if key and name and len(name) <= MAX_CLIENT_KEY:
        session = _owned_session(key=key, name=name)
        if session is not None:
            owner = cast(AbstractBaseUser, SimpleLazyObject(lambda: session.owner))
            return owner, session
    user = authenticate(key)
    return user, resolve_session(user=user, header=header, model=model)


def _owned_session(*, key: str, name: str) -> Session | None:
    """The session `name` (its id, or else a client key) of the active user whose API token
    is `key`. Written out: the ORM's compilation of this three-table join cost as much as the
    query, on every provider call."""
    try:
        column, value = "id", Session._meta.pk.get_db_prep_value(uuid.UUID(name), connection)  # type: ignore[union-attr]
    except ValueError:
        column, value = "client_key", name
    sql = _owned_session_sql(connection.vendor, column)
    found = raw_rows.instances(Session, sql, [key, True, value])
    return found[0] if found else None


@lru_cache(maxsize=8)
def _owned_session_sql(vendor: str, column: str) -> str:
    """`_owned_session`'s statement, looking the session up by `column` (built once each)."""
    quote = connection.ops.quote_name
    user_model = get_user_model()
    # Identifiers come from the models and quote_name, values are parameters.
    return (
        f"SELECT {raw_rows.columns(Session, alias='s')} "  # noqa: S608
        f"FROM {quote(Session._meta.db_table)} s "
        f"JOIN {quote(Token._meta.db_table)} t ON t.{quote('user_id')} = s.{quote('owner_id')} "
        f"JOIN {quote(user_model._meta.db_table)} u ON u.{quote('id')} = s.{quote('owner_id')} "
        f"WHERE t.{quote('key')} = %s AND u.{quote('is_active')} = %s AND s.{quote(column)} = %s"
    )


@dataclass(frozen=True)
class Recorded:
    session: Session
    start: int  # index of the first message that was new
    created: int


def _match_start(session: Session, count: int, convert: Converter) -> int:
    """Index of the first client message the ledger does not hold yet."""
    known, known_hash = session.gateway_prefix_len, session.gateway_prefix_hash
    if 0 < known <= count and convert(known - 1).hash == known_hash:
        return known
    hashes = [convert(index).hash for index in range(count)]
    ids = {event_id(session.pk, index, h, 0): index for index, h in enumerate(hashes)}
    stored = Event.objects.filter(session=session, id__in=list(ids)).values_list("id", flat=True)
    positions = [ids[pk] for pk in stored]
    if positions:
        return max(positions) + 1
    # No message at its own position: a session recorded some other way (the REST API, an
    # import). Anything up to the last message the ledger already holds counts as recorded.
    recorded = set(
        Event.objects.filter(session=session, message_hash__in=set(hashes)).values_list(
            "message_hash", flat=True
        )
    )
    for event in Event.objects.filter(session=session, message_hash="").only(
        "type", "content", "tool_call_id"
    ):
        tool_ids = (event.tool_call_id,) if event.tool_call_id else ()
        recorded.add(message_hash(ROLE_FOR_TYPE[event.type], event.content, tool_ids))
    last = max((index for index, h in enumerate(hashes) if h in recorded), default=-1)
    return last + 1


def record_request(
    *,
    session: Session,
    count: int,
    convert: Converter,
    window: int | None,
) -> Recorded:
    """Append the request's new messages (ids derived from position and hash, so a retry or
    a concurrent duplicate stores nothing twice). With `window` set, a new message that alone
    exceeds it is refused before anything is stored."""
    # No lock around the match: the ids derived from position and hash make the append
    # idempotent under the append's own lock, and the remembered prefix is only a hint.
    start = _match_start(session, count, convert)
    new = [(index, convert(index)) for index in range(start, count)]
    if window is not None and new:
        counter = tokens.counter_for_model(session.model)
        for index, message in new:
            cost = (
                sum(
                    tokens.messages_batch_tokens(
                        counter,
                        [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in message.drafts],
                    )
                )
                + tokens.REPLY_PRIMER
            )
            if cost > window:
                raise GatewayError(
                    f"message {index} alone is {cost} tokens; the context window of "
                    f"{session.model} is {window}",
                    code="context_length_exceeded",
                    param="messages",
                    tokenCount=cost,
                    limit=window,
                    model=session.model,
                )
    inputs = [
        EventInput(
            id=event_id(session.pk, index, message.hash, part),
            type=draft.type,
            content=draft.content,
            name=draft.name,
            tool_call_id=draft.tool_call_id,
            message_hash=message.hash,
        )
        for index, message in new
        for part, draft in enumerate(message.drafts)
    ]
    created = 0
    fresh = session
    last_hash = convert(count - 1).hash if count else ""
    if inputs:
        try:
            result = event_append(
                session=session,
                events=inputs,
                session_updates=_prefix_updates(count, last_hash),
            )
        except LedgerError as exc:
            raise GatewayError(exc.detail, code=exc.code, param="messages") from None
        created = result.created
        fresh = result.session or Session.objects.get(pk=session.pk)
    if count and (count, last_hash) != (fresh.gateway_prefix_len, fresh.gateway_prefix_hash):
        # Nothing new was stored (or a concurrent client moved the prefix): remember it anyway.
        Session.objects.filter(pk=session.pk, gateway_prefix_len__lte=count).update(
            **_prefix_updates(count, last_hash)
        )
    return Recorded(session=fresh, start=start, created=created)


def _prefix_updates(length: int, digest: str) -> dict[str, Any]:
    """Session updates saying the ledger now holds the client's first `length` messages, the
    last of them hashing to `digest`. Last writer wins: the prefix is a hint that a request
    checks before using (a concurrent client's prefix only sends the next request down the
    full match)."""
    return {"gateway_prefix_len": length, "gateway_prefix_hash": digest}


def record_reply(
    *,
    session: Session,
    position: int,
    reply: Reply,
    forwarded_tokens: int,
    incomplete: bool = False,
    metadata: dict[str, Any] | None = None,
    client_tokens: int | None = None,
) -> Sequence[Event]:
    """Append the provider's reply (AGENT_MESSAGE and TOOL_CALLs) with its usage, the serving
    model, and our count of what was forwarded beside the provider's (count drift).
    `client_tokens` is our count of the client's request as it arrived when fitting changed
    it: the difference is what fitting kept from being sent (the session's savedTokens)."""
    session_id = session.pk
    message = reply.message
    digest = message.hash
    meta: dict[str, Any] = {"model": reply.model, "gateway": True, **(metadata or {})}
    if incomplete:
        meta["incomplete"] = True
    usage = None
    if reply.prompt_tokens is not None or reply.completion_tokens is not None:
        usage = TokenUsage(
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            total_tokens=reply.total_tokens
            if reply.total_tokens is not None
            else (reply.prompt_tokens or 0) + (reply.completion_tokens or 0),
            cached_input_tokens=reply.cached_input_tokens,
            cache_write_tokens=reply.cache_write_tokens,
            cache_write_1h_tokens=reply.cache_write_1h_tokens,
        )
    saved = saved_tokens(client_tokens=client_tokens, forwarded_tokens=forwarded_tokens)
    inputs = []
    for part, draft in enumerate(message.drafts):
        first = part == 0
        inputs.append(
            EventInput(
                id=event_id(session_id, position, digest, part),
                type=draft.type,
                content=draft.content,
                name=draft.name,
                tool_call_id=draft.tool_call_id,
                message_hash=digest,
                token_usage=usage if first else None,
                # Counted once per call, with its usage.
                saved_tokens=saved if first and usage is not None else 0,
                metadata={
                    **meta,
                    **(
                        {
                            "forwardedTokens": forwarded_tokens,
                            "providerPromptTokens": reply.prompt_tokens,
                            "usage": reply.raw_usage,
                            **(
                                {"clientTokens": client_tokens, "savedTokens": saved}
                                if client_tokens is not None
                                else {}
                            ),
                        }
                        if first
                        else {}
                    ),
                },
            )
        )
    changes: dict[str, Any] = {"last_serving_model": reply.model[:200]}
    if reply.prompt_tokens is not None and not incomplete:
        changes.update(
            last_forwarded_tokens=forwarded_tokens,
            last_provider_prompt_tokens=reply.prompt_tokens,
        )
    # In the append's own UPDATE, so the usage it broadcasts already carries the drift.
    updates = {**changes, **_prefix_updates(position + 1, digest)}

    if not inputs:
        Session.objects.filter(pk=session_id).update(**updates)
        return []
    # A retried request gets its reply again at the same position, usually with other usage
    # figures: the reply recorded first stands, and a retry records nothing twice
    # (event_append would refuse the changed body as an idempotency conflict).
    try:
        return event_append(session=session, events=inputs, session_updates=updates).events
    except Conflict:
        pass
    ids = [item.id for item in inputs]
    recorded = set(Event.objects.filter(pk__in=ids).values_list("pk", flat=True))
    fresh = [item for item in inputs if item.id not in recorded]
    if fresh:
        # A concurrent retry may record it between the look-up and the append.
        with contextlib.suppress(Conflict):
            event_append(session=session, events=fresh, session_updates=updates)
    return list(Event.objects.filter(pk__in=ids).order_by("seq"))
