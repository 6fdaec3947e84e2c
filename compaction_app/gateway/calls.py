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
import time
from dataclasses import dataclass, field
from typing import Any

from rest_framework.authtoken.models import Token

from compaction_app import telemetry
from compaction_app.gateway.messages import Reply, chain_hash, event_id
from sessions_app import sql
from sessions_app.calls import call_record
from sessions_app.models import CallStatus, Session

logger = logging.getLogger("compaction_app.gateway")


@dataclass
class Trace:
    wire: str
    key: str | None
    session_header: str | None
    model_requested: str = ""
    stream: bool = False
    started_at: datetime.datetime = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC)
    )
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


def save(trace: Trace) -> None:
    """Store the call (sync; after.py's worker thread), then hand its span to the
    OpenTelemetry exporter when export is on. Never raises."""
    call = None
    try:
        call = _save(trace)
    except Exception:
        logger.exception("gateway: recording a call failed")
    telemetry.call_span(trace, call)


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
    reply = trace.reply
    return call_record(
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
        prompt_tokens=reply.prompt_tokens if reply else None,
        cached_input_tokens=reply.cached_input_tokens if reply else None,
        cache_write_tokens=reply.cache_write_tokens if reply else None,
        cache_write_1h_tokens=reply.cache_write_1h_tokens if reply else None,
        completion_tokens=reply.completion_tokens if reply else None,
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
        usage_dropped=reply.usage_dropped if reply else None,
    )
