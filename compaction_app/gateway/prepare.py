"""The gateway's sync steps before forwarding (run on the gateway's worker threads, workers.py):
who calls, which session, record the request's new messages, fit.

A fit that may compact synchronously (the hard limit) can wait for a remote summarizer for
its whole timeout: it is not done on the short-hop database threads, whose few slots every
provider call needs. `prepare` records and, when the fit is cheap, fits in the same hop;
otherwise it leaves `fitted` unset and the view runs `fit_call` on the long-work executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compaction_app import fitting
from compaction_app.gateway import after, bill, thread_fit
from compaction_app.gateway.fit import Fitted, fit, model_window, room
from compaction_app.gateway.messages import ClientMessage, GatewayError, GatewayInputError
from compaction_app.gateway.record import Recorded, caller_and_session
from compaction_app.gateway.thread_fit import ThreadRequest
from compaction_app.gateway.wire import Wire
from sessions_app.models import Session, Thread
from sessions_app.services import session_update
from sessions_app.threads import main_thread


class Converter:
    """Client messages converted on demand (and once): matching touches only the new ones.

    `offset`: the request continues a conversation the provider keeps (`continues`), so its
    units come after the `offset` messages its thread already holds; those are stood in for
    by the hashes the thread remembers (its anchor and its last message), which is all
    matching looks at."""

    def __init__(
        self,
        wire: Wire,
        units: list[dict[str, Any]],
        *,
        offset: int = 0,
        known: dict[int, str] | None = None,
    ) -> None:
        self.wire = wire
        self.units = units
        self.offset = offset
        self.known = known or {}
        self.cache: dict[int, ClientMessage] = {}

    @property
    def count(self) -> int:
        return self.offset + len(self.units)

    def __call__(self, index: int) -> ClientMessage:
        found = self.cache.get(index)
        if found is None:
            if index < self.offset:
                found = _StandIn(self.known.get(index, ""))
            else:
                try:
                    found = self.wire.to_client_message(
                        self.units[index - self.offset], index - self.offset
                    )
                except GatewayInputError as exc:
                    raise GatewayError(
                        exc.message, param=exc.param or self.wire.MESSAGES_PARAM
                    ) from None
            self.cache[index] = found
        return found


class _StandIn(ClientMessage):
    """A message the session holds and the request does not repeat."""

    def __init__(self, digest: str) -> None:
        super().__init__(role="", hash_text="", tool_ids=(), drafts=())
        object.__setattr__(self, "_digest", digest)

    @property
    def hash(self) -> str:
        return str(self.__dict__["_digest"])


class _Units(Sequence[dict[str, Any]]):
    """The request's units as thread matching counts them: those the provider keeps (stood in
    for, never read) and then the request's own."""

    def __init__(self, convert: Converter) -> None:
        self.convert = convert

    def __len__(self) -> int:
        return self.convert.count

    def __getitem__(self, index: Any) -> Any:
        offset = self.convert.offset
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return {} if index < offset else self.convert.units[index - offset]


@dataclass
class Call:
    session: Session
    user: Any
    position: int
    # None: the fit may compact, and runs on the long-work executor (fit_call).
    fitted: Fitted | None
    # Threads (thread_fit.py, record.py): the request as recorded; the reply continues it.
    request: ThreadRequest | None
    # What the call's appends announce, sent once the response is ready (see after.py).
    announced: after.Announcements
    # The request's messages as converted for matching (the bill counts them again).
    convert: Converter | None = None
    # Our count of the client's request as it arrived, taken only when fitting changed what
    # is forwarded (see gateway/bill.py); None otherwise.
    client_tokens: int | None = None
    # Where the request's messages are in the ledger (the calls ledger's `request_map`).
    request_map: dict[str, Any] | None = None
    # Whether fitting may change what is forwarded (False: X-Ledger-Fit: off, or a request
    # that continues a conversation the provider keeps).
    fit_enabled: bool = True


def may_compact(*, session: Session, body: dict[str, Any], model: str, enabled: bool) -> bool:
    """Whether fitting `model` may run a synchronous compaction: past the compact threshold
    (a thread's crossing compacts once, down to fitTargetRatio) or at the hard limit. Judged
    on the session's active context, which holds every thread's, so it errs towards the
    long-work executor; the same numbers `fit` decides on, without doing anything."""
    if not enabled:
        return False
    level = fitting.window_level(
        tokens=session.context_tokens,
        window=room(session, body, model),
        policy=fitting.session_policy(session),
    )
    return level != fitting.OK


def prepare(
    *,
    wire: Wire,
    key: str | None,
    session_header: str | None,
    body: dict[str, Any],
    units: list[dict[str, Any]],
    model: str,
    fit_enabled: bool,
    continues: bool,
    announced: after.Announcements,
    thread_name: str | None = None,
    context_limit: int | None = None,
    default_context_limit: int | None = None,
) -> Call:
    """Authenticate, resolve the session, record what is new, and fit unless that may
    compact (then `fitted` is None). `context_limit` (X-Ledger-Context-Limit) is the window
    the client's model holds: a session created now takes it, an existing one follows it
    when it changes (as a PATCH of its contextLimit would)."""
    user, session = caller_and_session(
        key=key,
        header=session_header,
        model=model,
        context_limit=context_limit,
        default_context_limit=default_context_limit,
    )
    if context_limit is not None and session.context_limit != context_limit:
        session = session_update(session=session, context_limit=context_limit)
    convert = Converter(wire, units)
    if continues:
        # What the provider keeps stands before the new items: the thread they continue (the
        # one named, else the main one) remembers where it stopped.
        name = (thread_name or "").strip()
        thread = (
            Thread.objects.filter(session=session, key=name).first()
            if name
            else main_thread(session=session)
        )
        if thread is not None and thread.length:
            convert = Converter(
                wire,
                units,
                offset=thread.length,
                known={
                    thread.anchor_index: thread.anchor_hash,
                    thread.length - 1: thread.last_hash,
                },
            )
    window = model_window(session, model) if fit_enabled else None
    recorded, request = thread_fit.record_thread(
        session=session,
        units=_Units(convert),
        convert=convert,
        window=window,
        thread_name=thread_name,
    )
    call = Call(
        session=recorded.session,
        user=user,
        position=convert.count,
        fitted=None,
        request=request,
        announced=announced,
        convert=convert,
        request_map=request_map(recorded, count=convert.count),
        fit_enabled=fit_enabled,
    )
    if not may_compact(session=call.session, body=body, model=model, enabled=fit_enabled):
        call.fitted = fit_call(call=call, wire=wire, body=body, model=model, enabled=fit_enabled)
    return call


def request_map(recorded: Recorded, *, count: int) -> dict[str, Any]:
    """Where the request's messages are in the ledger: the last message it continued and the
    runs of seqs its new messages occupy (sessions_app.call_story rebuilds it)."""
    return {
        "after": str(recorded.after_event) if recorded.after_event else None,
        "seqs": seq_runs(recorded.new_seqs),
        "messages": count,
    }


def seq_runs(seqs: Sequence[int]) -> list[list[int]]:
    """`seqs` as [first, last] runs of consecutive numbers."""
    runs: list[list[int]] = []
    for seq in sorted(seqs):
        if runs and runs[-1][1] + 1 == seq:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return runs


def fit_call(
    *,
    call: Call,
    wire: Wire,
    body: dict[str, Any],
    model: str,
    enabled: bool,
    fresh: bool = False,
) -> Fitted:
    """Fit the call's session to `model`; `fresh` re-reads the session (a fallback model,
    after the first attempt's fit may have compacted it)."""
    session = Session.objects.get(pk=call.session.pk) if fresh else call.session
    fitted = fit(
        session=session,
        user=call.user,
        wire=wire,
        body=body,
        model=model,
        enabled=enabled,
        same_model_as_request=not fresh,
        request=call.request,
    )
    if fitted.compacted and call.client_tokens is None and call.convert is not None:
        convert = call.convert
        call.client_tokens = bill.client_request_tokens(
            model=session.model,
            messages=(convert(index) for index in range(convert.count)),
            body=body,
        )
    return fitted
