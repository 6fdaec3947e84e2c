"""Gateway services (sync, ORM): who is calling, which session, which thread of it, which of
the resent messages are new, and the reply.

Matching is O(new messages): each thread remembers how many messages its history had and the
hash of the last one. When the next request still has that message at that position, it
continues that thread and everything after it is new. Otherwise (a new writer, a client that
edited its history, a retry) the full request is matched against the stored chain ids once;
a request that continues no recorded conversation starts a thread of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.functional import SimpleLazyObject
from rest_framework.authtoken.models import Token

from compaction_app import thread_scope
from compaction_app.gateway import usage as usage_figures
from compaction_app.gateway.fitted import limit_phrase
from compaction_app.gateway.messages import (
    ClientMessage,
    GatewayError,
    Reply,
    chain_hash,
    chain_hashes,
    event_id,
    message_hash,
)
from sessions_app import sql, tokens
from sessions_app.errors import Conflict, LedgerError
from sessions_app.models import ROLE_FOR_TYPE, Event, Session, Thread
from sessions_app.pricing import saved_tokens
from sessions_app.services import (
    EventInput,
    RowUpdate,
    TokenUsage,
    event_append,
    model_registry,
    session_bill_call_again,
    session_create,
    session_note_reply,
    thread_get_or_create,
    thread_remember,
)
from sessions_app.storable import storable, storable_text

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


def resolve_session(
    *,
    user: AbstractBaseUser,
    header: str | None,
    model: str,
    context_limit: int | None = None,
    default_context_limit: int | None = None,
) -> Session:
    """The session named by `X-Ledger-Session`: a session id of this user, or a client key
    (any string up to 200 characters) that gets or creates the user's session for `model`.
    Another user's session id is a 404, as if it did not exist.

    A session created here takes the window `context_limit` (the call's
    X-Ledger-Context-Limit), else the registry's for `model`, else `default_context_limit`
    (LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT: a local model the registry does not know)."""
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
    limit = context_limit
    if limit is None and model_registry().lookup(model.strip()) is None:
        limit = default_context_limit
    try:
        with transaction.atomic():
            return session_create(
                owner=user, model=model, title=key[:200], client_key=key, context_limit=limit
            )
    except IntegrityError:
        # Two first requests of one thread raced; the other one created it.
        return Session.objects.get(owner_id=user.pk, client_key=key)
    except LedgerError as exc:
        if exc.code == "unknown_model":
            # A gateway client cannot pass the API's contextLimit: say what it can do.
            raise GatewayError(unknown_model_message(model), code=exc.code, param="model") from None
        raise GatewayError(exc.detail, code=exc.code, param="model") from None


def unknown_model_message(model: str) -> str:
    return (
        f"unknown model {model.strip()!r}: the ledger does not know its context window. Send "
        "it with the X-Ledger-Context-Limit header (tokens), or set "
        "LEDGER_GATEWAY_DEFAULT_CONTEXT_LIMIT or MODEL_CONTEXT_OVERRIDES on the server"
    )


def caller_and_session(
    *,
    key: str | None,
    header: str | None,
    model: str,
    context_limit: int | None = None,
    default_context_limit: int | None = None,
) -> tuple[AbstractBaseUser, Session]:
    """`authenticate` and `resolve_session` in one query when the session exists (every call
    but a thread's first); anything else takes the two steps, with their errors. The user is
    then loaded only if something asks for more than its id (a compaction records who asked)."""
    name = (header or "").strip()
    if key and name and len(name) <= MAX_CLIENT_KEY:
        session = sql.owned_session(key=key, name=name)
        if session is not None:
            owner = cast(AbstractBaseUser, SimpleLazyObject(lambda: session.owner))
            return owner, session
    user = authenticate(key)
    return user, resolve_session(
        user=user,
        header=header,
        model=model,
        context_limit=context_limit,
        default_context_limit=default_context_limit,
    )


@dataclass(frozen=True)
class Recorded:
    session: Session
    start: int  # index of the first message that was new
    created: int
    thread: Thread | None = None
    # Chain hash of every client message (see messages.chain_hash); the reply continues the last.
    chains: tuple[str, ...] = ()
    threads_seen: int = 1
    # Where the request is in the ledger (the calls ledger's request map): the first event id
    # of the last message it continued (None: it continued nothing) and the seqs of the events
    # its new messages are (stored now or by an earlier try).
    after_event: uuid.UUID | None = None
    new_seqs: tuple[int, ...] = ()


# A side call, a sub-agent or a parallel worker starts a thread of its own; this many of a
# session's most recent threads are tried for the O(new messages) match.
RECENT_THREADS = 16


def _fast_match(
    threads_: Sequence[Thread], count: int, convert: Converter
) -> tuple[Thread, int] | None:
    """The thread whose last seen history the request continues (its last message at the
    same place), longest history first; the request's new messages start at its length."""
    for thread in sorted(threads_, key=lambda t: -t.length):
        known = thread.length
        if (
            0 < known <= count
            and thread.last_chain
            and thread.anchor_index < known
            and convert(thread.anchor_index).hash == thread.anchor_hash
            and convert(known - 1).hash == thread.last_hash
        ):
            return thread, known
    return None


def _retry_match(
    session: Session, threads_: Sequence[Thread], count: int, convert: Converter
) -> tuple[Thread, str] | None:
    """The thread whose last call the request repeats (a client's retry: the same request
    again, its history not yet holding the reply): (the thread, the chain hash of the request's
    last message). The request must hold the thread's anchor, and its last message must be the
    one the stored reply answered (its event, found by the chain's id, has its hash)."""
    for thread in sorted(threads_, key=lambda t: -t.length):
        if (
            thread.request_chain
            and count == thread.length - 1
            and thread.anchor_index < count
            and convert(thread.anchor_index).hash == thread.anchor_hash
        ):
            stored = (
                Event.objects.filter(
                    pk=event_id(session.pk, thread.request_chain, 0), session_id=session.pk
                )
                .values_list("message_hash", flat=True)
                .first()
            )
            if stored and stored == convert(count - 1).hash:
                return thread, thread.request_chain
    return None


def _full_match(
    session: Session, count: int, convert: Converter, *, gateway_threads: bool
) -> tuple[int, str, list[str]]:
    """(index of the first new message, key of the thread the recorded part belongs to or "",
    every message's chain hash)."""
    hashes = [convert(index).hash for index in range(count)]
    chains = chain_hashes(hashes)
    ids = {event_id(session.pk, chain, 0): index for index, chain in enumerate(chains)}
    stored = list(
        Event.objects.filter(session=session, id__in=list(ids)).values_list("id", "metadata")
    )
    if stored:
        deepest, meta = max(((ids[pk], meta) for pk, meta in stored), key=lambda item: item[0])
        # Continuing only a system prompt is not continuing a conversation (a sub-agent or a
        # worker sharing the main loop's instructions starts a thread of its own).
        only_system = all(convert(index).role == "system" for index in range(deepest + 1))
        key = "" if only_system else str((meta or {}).get("thread") or "")
        return deepest + 1, key, chains
    if gateway_threads:
        return 0, "", chains  # continues none of the session's conversations
    # No message under its chain id and no thread yet: a session recorded some other way (the
    # REST API, an import). Anything up to the last message the ledger already holds counts
    # as recorded, in the session's main thread.
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
    return last + 1, (MAIN_KEY if last >= 0 else ""), chains


MAIN_KEY = "main"


def _thread_for(
    session: Session, key: str, *, named: bool, anchor_index: int, anchor_hash: str
) -> Thread:
    thread, created = thread_get_or_create(
        session=session, key=key, named=named, anchor_index=anchor_index, anchor_hash=anchor_hash
    )
    if created:
        # The usage push reads which threads the session has from the cache.
        thread_scope.forget_threads(session_id=session.pk)
    return thread


def record_request(
    *,
    session: Session,
    count: int,
    convert: Converter,
    window: int | None,
    thread_name: str | None = None,
) -> Recorded:
    """Match the request to its thread and append its new messages (ids derived from the
    chain hash, so a retry or a concurrent duplicate stores nothing twice while the same
    message after another history is its own event). With `window` set, a new message that
    alone exceeds it is refused before anything is stored."""
    # No lock around the match: the derived ids make the append idempotent under the append's
    # own lock, and a thread's remembered history is only a hint checked before use.
    recent = sql.recent_threads(session_id=session.pk, limit=RECENT_THREADS)
    fast = _fast_match(recent, count, convert)
    retry = None if fast is not None or count < 2 else _retry_match(session, recent, count, convert)
    if retry is not None:
        # Nothing is new: the reply, recorded after the same chain, is the one stored first.
        matched, last_chain = retry
        start, key = count, matched.key
        chains = [""] * (count - 1) + [last_chain]
    elif fast is not None:
        matched, start = fast
        tail = chain_hashes(
            [convert(index).hash for index in range(start, count)], matched.last_chain
        )
        # The chain hash of the matched history is the thread's; those before it are
        # computed only if something needs them (full_chains).
        chains = [""] * (start - 1) + [matched.last_chain] + tail
        key = matched.key
    else:
        start, key, chains = _full_match(session, count, convert, gateway_threads=bool(recent))
        matched = None
    if start < count and not key:
        # Continues no thread: a thread of its own, named after its first new message (the
        # same for a retry of it).
        key = chains[start][:16]
    elif not key:
        key = chains[-1][:16] if chains else MAIN_KEY
    name = (thread_name or "").strip()[:MAX_CLIENT_KEY]
    if name:
        key = name
    if matched is None or matched.key != key:
        anchor = min(start, count - 1) if count else 0
        matched = next((t for t in recent if t.key == key), None) or _thread_for(
            session,
            key,
            named=bool(name),
            anchor_index=anchor,
            anchor_hash=convert(anchor).hash if count else "",
        )
    thread = matched
    new = [(index, convert(index)) for index in range(start, count)]
    # Each draft's cost, when the window check below counted it: the append takes it as is
    # rather than tokenizing every new message a second time.
    costs: dict[tuple[int, int], int] = {}
    if window is not None and new:
        counter = tokens.counter_for_model(session.model)
        for index, message in new:
            parts = tokens.messages_batch_tokens(
                counter, [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in message.drafts]
            )
            costs.update(((index, part), cost) for part, cost in enumerate(parts))
            cost = sum(parts) + tokens.REPLY_PRIMER
            if cost > window:
                raise GatewayError(
                    f"message {index} alone is {cost:,} tokens; the room for messages is "
                    f"{room_phrase(session=session, window=window)}",
                    code="context_length_exceeded",
                    param="messages",
                    tokenCount=cost,
                    limit=window,
                    model=session.model,
                )
    inputs = [
        _storable_input(
            EventInput(
                id=event_id(session.pk, chains[index], part),
                type=draft.type,
                content=draft.content,
                name=draft.name,
                tool_call_id=draft.tool_call_id,
                message_hash=message.hash,
                metadata={"thread": thread.key},
                token_count=costs.get((index, part)),
            )
        )
        for index, message in new
        for part, draft in enumerate(message.drafts)
    ]
    created = 0
    fresh = session
    new_seqs: tuple[int, ...] = ()
    if inputs:
        try:
            result = event_append(session=session, events=inputs)
        except Conflict:
            # The same messages recorded meanwhile under another thread's name: they stand.
            result = None
        except LedgerError as exc:
            raise GatewayError(exc.detail, code=exc.code, param="messages") from None
        if result is not None:
            created = result.created
            fresh = result.session or Session.objects.get(pk=session.pk)
            new_seqs = tuple(event.seq for event in result.events)
    # The thread row is brought up to date once per call, with the reply (record_reply).
    return Recorded(
        session=fresh,
        start=start,
        created=created,
        thread=thread,
        chains=tuple(chains),
        threads_seen=len(recent) + (0 if any(t.pk == thread.pk for t in recent) else 1),
        after_event=event_id(session.pk, chains[start - 1], 0)
        if 0 < start <= len(chains) and chains[start - 1]
        else None,
        new_seqs=new_seqs,
    )


def room_phrase(*, session: Session, window: int) -> str:
    """The room a request's messages have, said as what limits it: the session's limit (its
    own, or the model's window) less what tool definitions take."""
    limit = session.context_limit
    said = limit_phrase(limit=limit, model=session.model)
    if window >= limit:
        return said
    return f"{window:,} tokens: {said}, less {limit - window:,} for tool definitions"


def _storable_input(item: EventInput) -> EventInput:
    """`item` as the ledger can hold it. The gateway is a proxy first: a NUL, a lone
    surrogate or a number past a double's range in a message or a reply was forwarded or
    delivered as it came, and is recorded replaced (sessions_app.storable) rather than
    refused, with what was replaced in the event's metadata (`replaced`). Message hashes stay
    those of the text as sent, so the client's next call still continues its thread."""
    replaced: set[str] = set()
    content = storable(item.content, replaced)
    name = storable_text(item.name, replaced)
    tool_call_id = storable_text(item.tool_call_id, replaced)
    metadata = storable(dict(item.metadata), replaced)
    if not replaced:
        return item
    return dataclasses.replace(
        item,
        content=content,
        name=name,
        tool_call_id=tool_call_id,
        metadata={**metadata, "replaced": sorted(replaced)},
        # Counted again from what is stored.
        token_count=None,
    )


_COUNTERS = ("calls", "prompt_tokens", "completion_tokens")


def _remember(
    thread: Thread, length: int, last_hash: str, last_chain: str, **more: Any
) -> RowUpdate:
    """The update that remembers the thread's history as this call leaves it (last writer
    wins: a hint), for the reply's append to carry in its own transaction (one commit per
    call). The instance is brought up to date now."""
    values: dict[str, Any] = {
        "length": length,
        "last_hash": last_hash,
        "last_chain": last_chain,
        "updated_at": timezone.now(),
    }
    deltas: dict[str, int] = {}
    for name, value in more.items():
        # Counters add up (concurrent calls of one thread); the rest is the last call's.
        if name in _COUNTERS:
            deltas[name] = value
        else:
            values[name] = value
    thread.length, thread.last_hash, thread.last_chain = length, last_hash, last_chain
    return RowUpdate(model=Thread, pk=thread.pk, deltas=deltas, values=values)


def _remember_alone(update: RowUpdate | None) -> None:
    """Apply the thread's update on its own (no append carried it)."""
    if update is not None:
        thread_remember(update=update)


def full_chains(count: int, convert: Converter) -> list[str]:
    """Every message's chain hash (the fast match computes only the new ones)."""
    return chain_hashes([convert(index).hash for index in range(count)])


def record_reply(
    *,
    session: Session,
    thread: Thread | None,
    after_chain: str,
    length: int,
    reply: Reply,
    forwarded_tokens: int,
    incomplete: bool = False,
    metadata: dict[str, Any] | None = None,
    thread_updates: dict[str, Any] | None = None,
    client_tokens: int | None = None,
) -> Sequence[Event]:
    """Append the provider's reply (AGENT_MESSAGE and TOOL_CALLs) with its usage, the serving
    model, and our count of what was forwarded beside the provider's (count drift).
    `client_tokens` is our count of the client's request as it arrived when fitting changed
    it: the difference is what fitting kept from being sent (the session's savedTokens)."""
    session_id = session.pk
    message = reply.message
    digest = message.hash
    chain = chain_hash(after_chain, digest)
    meta: dict[str, Any] = {"model": reply.model, "gateway": True, **(metadata or {})}
    if thread is not None:
        meta["thread"] = thread.key
    if incomplete:
        meta["incomplete"] = True
    # Figures no real reply holds (past the ledger's bound, cache parts larger than the
    # prompt, unreadable ones) were dropped per field when the reply was read (Reply), and
    # are noted, so the reply itself is always recorded.
    if reply.usage_dropped:
        meta["usageDropped"] = dict(reply.usage_dropped)
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
            reasoning_tokens=reply.reasoning_tokens,
            priced_apart=usage_figures.call_usages(reply.priced_apart),
        )
    saved = saved_tokens(client_tokens=client_tokens, forwarded_tokens=forwarded_tokens)
    inputs = []
    for part, draft in enumerate(message.drafts):
        first = part == 0
        inputs.append(
            _storable_input(
                EventInput(
                    id=event_id(session_id, chain, part),
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
        )
    changes: dict[str, Any] = {"last_serving_model": reply.model[:200]}
    if reply.prompt_tokens is not None and not incomplete:
        changes.update(
            last_forwarded_tokens=forwarded_tokens,
            last_provider_prompt_tokens=reply.prompt_tokens,
        )
    # In the append's own UPDATE, so the usage it broadcasts already carries the drift.
    updates = dict(changes)
    remembered = None
    if thread is not None:
        remembered = _remember(
            thread,
            length + 1,
            digest,
            chain,
            request_chain=after_chain,
            calls=1,
            prompt_tokens=reply.prompt_tokens or 0,
            completion_tokens=reply.completion_tokens or 0,
            **(thread_updates or {}),
        )

    def bill_again() -> None:
        # The provider answered (and billed) this call, whose reply the ledger already held:
        # the session's bill counts every call answered, retries included (sessions_app.scope).
        if usage is not None:
            session_bill_call_again(
                session_id=session_id, model=reply.model, usage=usage, saved_tokens=saved
            )

    if not inputs:
        session_note_reply(session_id=session_id, updates=updates)
        bill_again()  # a reply with nothing to store is still a call the provider billed
        _remember_alone(remembered)
        return []
    # A retried request gets its reply again at the same position, usually with other usage
    # figures: the reply recorded first stands, and a retry records nothing twice
    # (event_append would refuse the changed body as an idempotency conflict).

    try:
        # The thread's row commits with the reply: one commit per recorded call.
        result = event_append(
            session=session, events=inputs, session_updates=updates, also_update=remembered
        )
    except Conflict:
        # Nothing of that append was stored, the thread's update neither.
        pass
    else:
        if not result.created:
            bill_again()  # an identical retry: every event was already stored
        return result.events
    _remember_alone(remembered)
    ids = [item.id for item in inputs]
    recorded = set(Event.objects.filter(pk__in=ids).values_list("pk", flat=True))
    fresh = [item for item in inputs if item.id not in recorded]
    if inputs[0].id in recorded:
        bill_again()  # the reply that carries the usage was stored by an earlier answer
    if fresh:
        # A concurrent retry may record it between the look-up and the append.
        with contextlib.suppress(Conflict):
            event_append(session=session, events=fresh, session_updates=updates)
    return list(Event.objects.filter(pk__in=ids).order_by("seq"))
