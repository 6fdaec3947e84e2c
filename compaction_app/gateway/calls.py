"""What the gateway measures of one call (`Trace`), handed to the calls ledger
(sessions_app.calls) once the response is sent.

The views fill a trace as the call goes (the session, each model tried, the first byte, the
reply's usage, how it ended); after.py stores it from its worker thread together with the
call's announcements, so recording a call costs the call nothing: no statement, no commit
on its way. A call refused before its session is known is attributed to the session its
headers name, when the caller's key owns it; otherwise it is a session-less row of the
key's owner (joined to the session its X-Ledger-Session later creates). A call without a
valid API token records nothing.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rest_framework.authtoken.models import Token

from compaction_app import economics, telemetry
from compaction_app.gateway import cache_record, clock
from compaction_app.gateway import usage as usage_figures
from compaction_app.gateway.messages import Reply, chain_hash, event_id
from sessions_app import budgets, sql, tokens
from sessions_app.calls import call_record
from sessions_app.models import ROLE_FOR_TYPE, CallStatus, Session
from sessions_app.services import session_add_estimate

logger = logging.getLogger("compaction_app.gateway")


@dataclass
class Trace:
    wire: str
    key: str | None
    session_header: str | None
    model_requested: str = ""
    stream: bool = False
    # The gateway's clock (clock.py): what provider cache lifetimes are measured against.
    started_at: datetime.datetime = field(default_factory=clock.now)
    started: float = field(default_factory=time.monotonic)
    session: Session | None = None
    thread: str = ""
    status: str = ""
    http_status: int | None = None
    error_code: str = ""
    error: str = ""
    first_byte: float | None = None
    ended: float | None = None
    model_served: str = ""
    reply: Reply | None = None
    reply_event: Any = None  # the reply's first event id, when it was recorded
    fitted: bool = False
    forwarded_tokens: int | None = None
    saved_tokens: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    # What was forwarded upstream (the body as sent, or as fitted) and by which wire; how the
    # thread was fitted ("as_sent", "fitted", "compacted", "pruned"), and whether this call's
    # fit ran a compaction. Read once the answer is out (cache_outcome.py).
    wire_module: Any = None
    forwarded_body: dict[str, Any] | None = None
    # The client's own body, when the gateway forwarded another (fitted or rebuilt).
    client_body: dict[str, Any] | None = None
    fit_how: str = ""
    compacted_now: bool = False
    continues: bool = False
    # (session id, thread) once the call is known to be stored in its thread's order.
    tracked: tuple[Any, str] | None = None
    # What the call reserved on its budgets (gateway/budget.py), settled when it is stored.
    reservation: Any = None
    # The call's price once stored (its reservation is settled with it).
    cost_nano_usd: int | None = None

    def note_forwarded(
        self,
        *,
        wire: Any,
        body: dict[str, Any],
        how: str,
        compacted: bool,
        client_body: dict[str, Any] | None = None,
    ) -> None:
        self.wire_module = wire
        self.forwarded_body = body
        self.client_body = client_body
        self.fit_how = how or ""
        self.compacted_now = compacted

    # When the request first went upstream (monotonic): the gateway's own time before it.
    forwarded: float | None = None
    # The request's and the response's headers, as references: masked and stored off the
    # call's path (sessions_app.calls.masked_headers).
    request_headers: Any = None
    response_headers: Any = None
    # How fitting treated the request, and where its messages are in the ledger.
    fit: dict[str, Any] = field(default_factory=dict)
    request_map: dict[str, Any] | None = None

    def mark_forwarded(self) -> None:
        if self.forwarded is None:
            self.forwarded = time.monotonic()

    def mark_first_byte(self) -> None:
        if self.first_byte is None:
            self.first_byte = time.monotonic()

    def end(
        self, status: str, *, http_status: int | None = None, code: str = "", error: str = ""
    ) -> None:
        """How the call ended; the first ending given stands (a stream's on_end after the
        view's own)."""
        if self.status:
            return
        self.status = status
        self.http_status = http_status
        self.error_code = code
        self.error = error
        self.ended = time.monotonic()

    def attempt(self, model: str, outcome: str, http_status: int | None = None) -> None:
        entry: dict[str, Any] = {"model": model, "outcome": outcome}
        if http_status is not None:
            entry["httpStatus"] = http_status
        self.attempts.append(entry)

    def replied(self, *, reply: Reply, after_chain: str | None) -> None:
        """The reply as recorded: its usage, and where its events are (ids derived as
        record.record_reply derives them)."""
        self.reply = reply
        self.model_served = reply.model
        if self.request_map is not None:
            self.request_map["replyParts"] = len(reply.message.drafts)
        if after_chain is not None and self.session is not None:
            self.reply_event = event_id(
                self.session.pk, chain_hash(after_chain, reply.message.hash), 0
            )

    def _ms(self, moment: float | None) -> int | None:
        return None if moment is None else max(int(round((moment - self.started) * 1000)), 0)


# Calls of one thread are stored in the order they started: a call's cache outcome is read
# against the previous call's stored prefix, and the previous call's announcements may still
# be on another worker thread when the next call's are sent (a provider that answers in a
# millisecond). Per process; see docs/costs.md for several processes.
_order = threading.Condition()
_pending: dict[tuple[Any, str], list[float]] = {}
ORDER_WAIT_SECONDS = 5.0


def track(trace: Trace) -> None:
    """Note that `trace` (its session and thread now known) will be stored."""
    if trace.session is None or trace.tracked is not None:
        return
    key = (trace.session.pk, trace.thread)
    with _order:
        _pending.setdefault(key, []).append(trace.started)
    trace.tracked = key


def _wait_turn(trace: Trace) -> None:
    key = trace.tracked
    if key is None:
        return
    with _order:
        _order.wait_for(
            lambda: not any(started < trace.started for started in _pending.get(key, ())),
            timeout=ORDER_WAIT_SECONDS,
        )


def _done(trace: Trace) -> None:
    key = trace.tracked
    if key is None:
        return
    with _order:
        waiting = _pending.get(key, [])
        if trace.started in waiting:
            waiting.remove(trace.started)
        if not waiting:
            _pending.pop(key, None)
        _order.notify_all()


def save(trace: Trace) -> None:
    """Store the call (sync; after.py's worker thread), then hand its span to the
    OpenTelemetry exporter when export is on. Never raises."""
    call = None
    try:
        _wait_turn(trace)
        call = _save(trace)
    except Exception:
        logger.exception("gateway: recording a call failed")
    finally:
        _done(trace)
        _settle(trace)
    telemetry.call_span(trace, call)


def _settle(trace: Trace) -> None:
    """Swap the call's budget reservation for its price (0 when it cost nothing or could not
    be stored: a reservation never outlives its call)."""
    if trace.reservation is None:
        return
    try:
        budgets.budget_settle(reservation=trace.reservation, actual=trace.cost_nano_usd or 0)
    except Exception:
        logger.exception("gateway: settling a call's budget reservation failed")


@dataclass(frozen=True)
class _Usage:
    prompt: int | None = None
    cached: int | None = None
    write: int | None = None
    write_1h: int | None = None
    completion: int | None = None
    reasoning: int | None = None
    status: str = ""
    apart: tuple[Any, ...] = ()


def _usage(trace: Trace, session: Session | None) -> _Usage:
    """The reply's usage as the provider reported it; when it answered without any (a stream
    whose client did not ask for usage), the gateway's own count of what it forwarded and of
    the reply, marked as absent (the cost is then an estimate, never 0). A reply whose every
    figure the one bound dropped (usage_bounds: 10^19 tokens, `1e400`, a negative count) has no
    usable usage either: it is estimated the same way, its `usage_dropped` saying what the
    provider sent."""
    reply = trace.reply
    if reply is None:
        return _Usage()
    if reply.prompt_tokens is not None or reply.completion_tokens is not None:
        return _Usage(
            prompt=reply.prompt_tokens,
            cached=reply.cached_input_tokens,
            write=reply.cache_write_tokens,
            write_1h=reply.cache_write_1h_tokens,
            completion=reply.completion_tokens,
            reasoning=reply.reasoning_tokens,
            status="reported",
            apart=usage_figures.call_usages(reply.priced_apart),
        )
    model = trace.model_served or trace.model_requested or (session.model if session else "")
    counter = tokens.counter_for_model(model)
    rows = [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in reply.message.drafts]
    completion = sum(tokens.messages_batch_tokens(counter, rows)) if rows else 0
    return _Usage(prompt=trace.forwarded_tokens or 0, completion=completion, status="absent")


def _cache(trace: Trace, session: Session, usage: _Usage) -> cache_record.CacheRecord | None:
    """The call's cache outcome (only for a call the provider answered with a reply)."""
    if (
        trace.reply is None
        or trace.forwarded_body is None
        or trace.wire_module is None
        or trace.continues
    ):
        return None
    reported = usage.status == "reported"
    try:
        return cache_record.cache_record(
            session=session,
            wire=trace.wire_module,
            body=trace.forwarded_body,
            model=trace.model_served or trace.model_requested or session.model,
            thread=trace.thread,
            started_at=trace.started_at,
            fit_how=trace.fit_how,
            compacted_now=trace.compacted_now,
            client_body=trace.client_body,
            provider_read=(usage.cached or 0) if reported else None,
            provider_write=usage.write if reported else None,
        )
    except Exception:
        logger.exception("gateway: a call's cache outcome could not be computed")
        return None


def _save(trace: Trace) -> Any:
    if not trace.status:
        # Ended without a word from the views: the client went away (the view was cancelled).
        trace.end(CallStatus.CLIENT_DISCONNECTED)
    session = trace.session
    name = (trace.session_header or "").strip()
    owner_id: Any = session.owner_id if session is not None else None
    if session is None and trace.key:
        if name:
            session = sql.owned_session(key=trace.key, name=name)
        if session is not None:
            owner_id = session.owner_id
        else:
            # Refused before its session existed: a session-less row its owner sees, which
            # joins the session its key creates later (sessions_app.calls.calls_attach).
            owner_id = (
                Token.objects.filter(key=trace.key, user__is_active=True)
                .values_list("user_id", flat=True)
                .first()
            )
    if owner_id is None:
        return None  # no valid API token: nobody to show it to (and no one to bill)
    usage = _usage(trace, session)
    cache = _cache(trace, session, usage) if session is not None else None
    # Let go of the forwarded body: the fingerprint is all that is kept of it.
    trace.forwarded_body = trace.client_body = None
    call = call_record(
        session_id=session.pk if session is not None else None,
        owner_id=owner_id,
        session_key=name,
        started_at=trace.started_at,
        wire=trace.wire,
        status=trace.status,
        thread=trace.thread,
        model_requested=trace.model_requested,
        model_served=trace.model_served,
        http_status=trace.http_status,
        error_code=trace.error_code,
        error=trace.error,
        stream=trace.stream,
        ttfb_ms=trace._ms(trace.first_byte),
        total_ms=trace._ms(trace.ended),
        prompt_tokens=usage.prompt,
        cached_input_tokens=usage.cached,
        cache_write_tokens=usage.write,
        cache_write_1h_tokens=usage.write_1h,
        completion_tokens=usage.completion,
        reasoning_tokens=usage.reasoning,
        usage_status=usage.status,
        priced_apart=usage.apart,
        cache=cache.document if cache is not None else None,
        prefix=cache.fingerprint if cache is not None else None,
        fitted=trace.fitted,
        forwarded_tokens=trace.forwarded_tokens,
        saved_tokens=trace.saved_tokens,
        attempts=trace.attempts,
        # None when the reply's append failed: then no event has this id (readers check).
        reply_event_id=trace.reply_event,
        gateway_ms=trace._ms(trace.forwarded),
        request_headers=trace.request_headers,
        response_headers=trace.response_headers,
        fit=trace.fit,
        request_map=trace.request_map,
        usage_dropped=trace.reply.usage_dropped if trace.reply is not None else None,
    )
    trace.cost_nano_usd = call.cost_nano_usd
    if call.cost_estimated and session is not None:
        # The session's bill counts it apart: the provider's figures are not known.
        session_add_estimate(session_id=session.pk, nano_usd=call.cost_nano_usd or 0)
    # What the compaction before this call saved or cost on it (compaction_app.economics);
    # a session never compacted has none to measure.
    if session is not None and (trace.compacted_now or session.last_compaction):
        economics.record_call(call=call, cache=cache.document if cache is not None else None)
    return call
