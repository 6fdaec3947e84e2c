"""Fit per thread, cache-stable: what one thread's request forwards.

The request itself is the thread's history (a side call's one message, a worker's own turns),
so fitting works on it, in its own shape (the wire's `render_fitted`: each provider package's
shape.py), never on the session's interleaved ledger. The ledger says which of the request's messages a compaction folded, which tool
results it cleared and what the summary says; each message is found by its chain id.

Hysteresis: below `compactThreshold` the thread forwards what the last compaction left plus
its new turns, unchanged (the client's own bytes when nothing was ever folded). Crossing the
threshold compacts once, down to `fitTargetRatio` of the window, with the session's strategy;
the next crossing is a whole `compactThreshold - fitTargetRatio` of the window away, and every
call in between forwards the previous call's request plus its new turns, byte for byte.
Per-call pruning is the last resort when no compaction can run (logged as
`context_window_approaching`, shown on the session page).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from django.contrib.auth.models import AbstractBaseUser

from compaction_app import fitting, thread_scope
from compaction_app.gateway import shape
from compaction_app.gateway.compressed import announce_compression
from compaction_app.gateway.fitted import Fitted, Wire, context_length_exceeded
from compaction_app.gateway.messages import (
    TOOL_RESULT,
    ClientMessage,
    GatewayError,
    Reply,
    event_id,
)
from compaction_app.gateway.record import (
    MAIN_KEY,
    Recorded,
    full_chains,
    record_reply,
    record_request,
)
from compaction_app.models import Trigger
from compaction_app.policy import Policy
from sessions_app import context_window, tokens
from sessions_app.models import Event, EventType, Session, Thread
from sessions_app.services import thread_note_error

logger = logging.getLogger("compaction_app.gateway")
audit = logging.getLogger("context")


@dataclass(frozen=True)
class ThreadRequest:
    """A request as recorded: its units (wire messages, the system prompt first where the
    wire keeps it apart), their converter, their chain hashes ("" where the cheap match did
    not compute them) and the thread it continues."""

    units: Sequence[dict[str, Any]]
    convert: Callable[[int], ClientMessage]
    chains: Sequence[str]
    thread: Thread | None
    threads_seen: int = 1
    # The thread's numbers as fitting leaves them, written with the reply (one UPDATE a call).
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _State:
    costs: dict[int, int]
    folded: frozenset[int]
    cleared: dict[int, dict[str, str]]
    summary: str | None


def _state(session: Session, request: ThreadRequest) -> _State | None:
    """Each unit's cost, fold and cleared results, from its events (None: some unit is not in
    the ledger under its chain id)."""
    count = len(request.units)
    chains = list(request.chains)
    if len(chains) != count or "" in chains:
        chains = full_chains(count, request.convert)
    where: dict[Any, int] = {}
    for index in range(count):
        for part in range(len(request.convert(index).drafts)):
            where[event_id(session.pk, chains[index], part)] = index
    rows = list(
        Event.objects.filter(session=session, id__in=list(where)).only(
            "id",
            "token_count",
            "cleared_token_count",
            "cleared_content",
            "compacted_by_id",
            "tool_call_id",
        )
    )
    if len(rows) != len(where):
        return None
    costs: dict[int, int] = dict.fromkeys(range(count), 0)
    standing: set[int] = set()
    cleared: dict[int, dict[str, str]] = {}
    for event in rows:
        index = where[event.pk]
        costs[index] += event.effective_token_count
        if event.compacted_by_id is None:
            standing.add(index)
        if event.cleared_content is not None:
            cleared.setdefault(index, {})[event.tool_call_id] = event.cleared_content
    # A message goes out whole while any part of it stands (the words beside a tool call
    # stay with the call the strategy kept).
    folded = set(range(count)) - standing
    summary = None
    if folded:
        summary = _covering_summary(
            session,
            {e.compacted_by_id for e in rows if where[e.pk] in folded and e.compacted_by_id},
        )
    return _State(costs=costs, folded=frozenset(folded), cleared=cleared, summary=summary)


def _covering_summary(session: Session, markers: set[Any]) -> str | None:
    """The summary that now stands for the thread's folded messages: the live COMPACTION
    event each fold leads to (a later run of the same thread folds the earlier summary into
    its own). Only runs that folded this thread's messages count, so another thread's
    summary never appears in its view."""
    live: dict[Any, tuple[int, str]] = {}
    seen: set[Any] = set()
    while markers:
        seen |= markers
        step: set[Any] = set()
        for pk, seq, content, parent in Event.objects.filter(
            session=session, pk__in=list(markers), type=EventType.COMPACTION
        ).values_list("pk", "seq", "content", "compacted_by_id"):
            if parent is None:
                live[pk] = (seq, content)
            elif parent not in seen:
                step.add(parent)
        markers = step
    texts = [content for _, content in sorted(live.values()) if content]
    return "\n\n".join(texts) or None


def _summary_cost(session: Session, summary: str | None) -> int:
    if summary is None:
        return 0
    counter = tokens.counter_for_model(session.model)
    return tokens.message_tokens(counter, role="system", content=shape.summary_text(summary))


def _compact(
    session: Session, user: AbstractBaseUser, target: float, thread: str
) -> fitting.RunOutcome | None:
    """One compaction of the thread's own events down to `target` with the session's
    strategy; None when none can run (nothing to fold or clear, one already under way, the
    summarizer failed: the call goes on, pruned if need be)."""
    try:
        return fitting.compact_to_fit(
            session=session,
            user=user,
            trigger=Trigger.GATEWAY,
            target_ratio=target,
            thread=thread,
        )
    except Exception:
        logger.exception("gateway: compaction in the call path failed (session %s)", session.pk)
        return None


class _Thread:
    """One thread's own request as a `fitting.Fittable`: its messages kept (not folded, the
    system ones always), the summary covering its folded ones, its compaction and its prune by
    whole turns."""

    def __init__(
        self,
        *,
        session: Session,
        user: AbstractBaseUser,
        request: ThreadRequest,
        state: _State,
        fixed: frozenset[int],
        starts: frozenset[int],
        policy: Policy,
        refusal: Callable[[int], GatewayError],
        model: str,
    ) -> None:
        self.session = session
        self.user = user
        self.request = request
        self.fixed = fixed
        self.starts = starts
        self.policy = policy
        self.refusal = refusal
        self.model = model
        self.compression: dict[str, Any] | None = None
        self._use(state)

    def _use(self, state: _State) -> None:
        self.state = state
        self.kept = [
            i for i in range(len(self.request.units)) if i not in state.folded or i in self.fixed
        ]
        self.extra = _summary_cost(self.session, state.summary)

    def cost(self) -> int:
        return context_window.context_cost([self.state.costs[i] for i in self.kept]) + self.extra

    def compact(self) -> fitting.RunOutcome | None:
        thread_key = self.request.thread.key if self.request.thread else ""
        run = _compact(self.session, self.user, self.policy.target_ratio, thread_key)
        if run is not None and run.completed:
            self.compression = announce_compression(session=self.session, run=run, model=self.model)
            fresh = _state(self.session, self.request)
            if fresh is not None:
                self._use(fresh)
        return run

    def prune(self, budget: int) -> bool:
        kept = fitting.prune_turns(
            kept=self.kept,
            costs=self.state.costs,
            fixed=self.fixed,
            starts=self.starts,
            extra=self.extra,
            budget=budget,
        )
        if kept is None:
            return False
        self.kept = kept
        return True

    def refuse(self) -> NoReturn:
        count = len(self.request.units)
        needed = (
            context_window.context_cost(
                [self.state.costs[i] for i in self.fixed] + [self.state.costs[count - 1]]
            )
            + self.extra
        )
        raise self.refusal(needed)


def fit_thread(
    *,
    session: Session,
    user: AbstractBaseUser,
    wire: Wire,
    body: dict[str, Any],
    model: str,
    limit: int,
    definitions: int,
    as_sent: Fitted,
    compacted: bool,
    request: ThreadRequest,
) -> Fitted | None:
    policy = fitting.session_policy(session)
    room = max(limit - definitions, 0)
    # One writer and nothing folded: the session's count is the thread's.
    if request.threads_seen <= 1 and fitting.passes_through(
        tokens=session.context_tokens, window=room, policy=policy, compacted=compacted
    ):
        _note(request, as_sent.token_count, "as_sent")
        return as_sent
    state = _state(session, request)
    if state is None:
        return None
    count = len(request.units)
    fixed = frozenset(i for i in range(count) if request.convert(i).role == "system")
    starts = frozenset(
        i
        for i in range(count)
        if request.convert(i).role == "user"
        and not any(d.type == TOOL_RESULT for d in request.convert(i).drafts)
    )

    thread = _Thread(
        session=session,
        user=user,
        request=request,
        state=state,
        fixed=fixed,
        starts=starts,
        policy=policy,
        refusal=lambda needed: context_length_exceeded(
            limit=limit, needed=needed + definitions, definitions=definitions, model=model
        ),
        model=model,
    )
    done = fitting.fit_sequence(
        thread,
        window=room,
        policy=policy,
        may_compact=lambda level: level.level != fitting.OK,
        session_id=session.pk,
    )
    state, kept, cost = thread.state, thread.kept, done.tokens
    compression, pruned = thread.compression, done.pruned
    total = cost + definitions
    touched = bool(state.folded or state.cleared or pruned)
    how = (
        "pruned"
        if pruned
        else ("compacted" if compression else ("fitted" if touched else "as_sent"))
    )
    _note(request, total, how)
    if not touched:
        return Fitted(
            model=model,
            body=as_sent.body,
            token_count=total,
            limit=limit,
            compacted=False,
        )
    plan = shape.Plan(
        kept=tuple(kept),
        summary=state.summary if state.folded else None,
        cleared={i: c for i, c in state.cleared.items() if i in set(kept)},
    )
    return Fitted(
        model=model,
        body=wire.render_fitted(body, request.units, plan, model),
        token_count=total,
        limit=limit,
        compacted=True,
        compression=compression,
    )


def _note(request: ThreadRequest, token_count: int, how: str) -> None:
    """The thread's numbers as this call leaves them (its usage and how it was fitted)."""
    request.notes.update(context_tokens=token_count, last_fit=how)


def record_thread(
    *,
    session: Session,
    units: Sequence[dict[str, Any]],
    convert: Callable[[int], ClientMessage],
    window: int | None,
    thread_name: str | None,
) -> tuple[Recorded, ThreadRequest | None]:
    """Record the request in its thread. A failure of the gateway's own bookkeeping (not a
    refusal of the request) is logged and the call goes on, fitted by the ledger's ladder
    or forwarded as sent."""
    try:
        recorded = record_request(
            session=session,
            count=len(units),
            convert=convert,
            window=window,
            thread_name=thread_name,
        )
    except GatewayError:
        raise
    except Exception as exc:
        logger.exception("gateway: recording the request failed (session %s)", session.pk)
        _note_error(session, None, f"recording a request failed: {type(exc).__name__}")
        return Recorded(session=session, start=len(units), created=0), None
    return recorded, ThreadRequest(
        units=units,
        convert=convert,
        chains=recorded.chains,
        thread=recorded.thread,
        threads_seen=recorded.threads_seen,
    )


def record_thread_reply(
    *,
    session: Session,
    request: ThreadRequest | None,
    length: int,
    reply: Reply,
    forwarded_tokens: int,
    incomplete: bool,
    metadata: dict[str, Any] | None,
    client_tokens: int | None = None,
) -> None:
    """Record the reply in the thread of the call that asked for it (its id continues that
    call's chain, so the same answer to another question is its own event). Never raises."""
    try:
        if request is None:
            raise RuntimeError("the request was not recorded")
        chains = list(request.chains)
        after_chain = chains[-1] if chains else ""
        if not after_chain and chains:
            after_chain = full_chains(len(request.units), request.convert)[-1]
        record_reply(
            session=session,
            thread=request.thread,
            after_chain=after_chain,
            length=length,
            reply=reply,
            forwarded_tokens=forwarded_tokens,
            incomplete=incomplete,
            metadata=metadata,
            thread_updates=dict(request.notes),
            client_tokens=client_tokens,
        )
    except Exception as exc:
        logger.exception("gateway: recording the reply failed (session %s)", session.pk)
        _note_error(
            session,
            request.thread if request else None,
            f"recording a reply failed: {type(exc).__name__}",
        )


def _note_error(session: Session, thread: Thread | None, text: str) -> None:
    """Show a bookkeeping failure on the session page (on its thread, else the session's
    main thread row); never raises itself."""
    try:
        if thread_note_error(session=session, thread=thread, text=text, main_key=MAIN_KEY):
            thread_scope.forget_threads(session_id=session.pk)
    except Exception:
        logger.exception("gateway: noting a bookkeeping failure failed")
