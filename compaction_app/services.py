"""Compaction services: request a run, execute it, revert it.

A run is planned by a pure strategy over the session's active context, summarized outside
any transaction (a provider call can take seconds), then applied in one transaction that
re-checks the plan against the events as they are at that moment.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, TypeVar

from django import db
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from compaction_app import evidence, telemetry, thread_scope
from compaction_app.enqueue import enqueue_memory_flush, enqueue_run_on_commit
from compaction_app.heartbeat import beating
from compaction_app.models import ACTIVE_STATUSES, CompactionRun, RunningSummary, RunStatus, Trigger
from compaction_app.policy import Policy
from compaction_app.realtime import broadcast, messages
from compaction_app.run_documents import run_snapshot
from compaction_app.selectors import latest_revertible_run
from compaction_app.signals import memory_flush
from compaction_app.strategies import SUMMARY_MESSAGE_OVERHEAD, context_cost, plan_compaction
from compaction_app.summarizers.base import SummarizerError, SummaryMessage
from compaction_app.summarizers.factory import build_summarizer
from compaction_app.sweeper import recover_stale_run
from compaction_app.types import Budget, Plan, PlanEvent
from sessions_app import tokens
from sessions_app.errors import Conflict, InvalidInput, ServiceUnavailable
from sessions_app.models import Event, EventType, Session, Thread
from sessions_app.selectors import event_content
from sessions_app.services import (
    Clearing,
    EventInput,
    compaction_undo,
    event_append,
    events_clear,
    events_fold,
    session_give_back_cumulative,
    session_record_compaction,
    session_recount_active,
    session_take_cumulative,
)
from sessions_app.session_settings import (
    STRATEGY_NAMES,
    SUMMARIZER_NAMES,
    SessionSettings,
)

logger = logging.getLogger("compaction_app")
audit = logging.getLogger("context")
T = TypeVar("T")

REFRESH_PREFIX = "[CONTEXT REFRESH]"


class TransientCompactionError(Exception):
    """A run failed in a way a retry may fix (provider 429/5xx/timeout)."""


@dataclass(frozen=True)
class DryRun:
    plan: Plan
    strategy: str
    fold_event_ids: list[str]


def _plan_events(session: Session, thread: str = "") -> list[PlanEvent]:
    # One thread's events only when the run has one (compaction_app/thread_scope.py).
    events = thread_scope.scoped(
        Event.objects.filter(session=session).active(), session=session, thread=thread
    ).order_by("seq")
    return [
        PlanEvent(
            id=str(event.id),
            seq=event.seq,
            type=event.type,
            token_count=event.effective_token_count,
            pinned=event.pinned,
            tool_call_id=event.tool_call_id,
            name=event.name,
            content=event.content if event.cleared_content is None else event.cleared_content,
        )
        for event in events
    ]


def _policy(session: Session) -> Policy:
    return Policy.of(SessionSettings.of(session.settings))


def _budget(session: Session, *, target_ratio: float | None, strict: bool = False) -> Budget:
    """What a run must reach and the room it gives recent work (compaction_app/policy.py)."""
    return _policy(session).budget(
        context_limit=session.context_limit, target_ratio=target_ratio, call_path=strict
    )


def _strict(run: CompactionRun) -> bool:
    """A call path's compaction down to its low-water mark (fitTargetRatio) must reach it."""
    return run.target_ratio is not None and run.trigger in (Trigger.GATEWAY, Trigger.HARD_LIMIT)


def _check_choice(value: str | None, choices: Sequence[str], field: str) -> None:
    if value is not None and value not in choices:
        raise InvalidInput(
            f"{field} must be one of {', '.join(choices)}",
            code=f"unknown_{field}",
            fields={field: f"must be one of: {', '.join(choices)}"},
        )


def compaction_plan(
    *,
    session: Session,
    strategy: str | None = None,
    summarizer: str | None = None,
    target_ratio: float | None = None,
    strict: bool = False,
    thread: str = "",
    project: bool = False,
) -> DryRun:
    """What a run would do now, changing nothing (the API's dryRun). Refuses the same bad
    input as a real request would."""
    strategy = strategy or SessionSettings.of(session.settings).strategy
    _check_choice(strategy, STRATEGY_NAMES, "strategy")
    _check_choice(summarizer, SUMMARIZER_NAMES, "summarizer")
    counter = tokens.counter_for_model(session.model)
    summarizer = summarizer or SessionSettings.of(session.settings).summarizer
    events = _plan_events(session, thread)
    plan = plan_compaction(
        strategy=strategy,
        events=events,
        budget=_budget(session, target_ratio=target_ratio, strict=strict),
        count_tokens=counter.count,
    )
    if project and plan.needs_summary and summarizer == "local":
        plan = _projected(session=session, thread=thread, plan=plan, events=events)
    return DryRun(plan=plan, strategy=strategy, fold_event_ids=list(plan.fold_ids))


def _projected(*, session: Session, thread: str, plan: Plan, events: Sequence[PlanEvent]) -> Plan:
    """A summarize plan whose `tokens_after` is what the run will leave, not the reserve's
    bound: the offline summarizer is deterministic, so the dry run writes the very summary the
    run would and prices its message as the ledger will (a remote summarizer's reply cannot be
    known beforehand: its plan keeps the bound)."""
    folded = list(
        Event.objects.filter(pk__in=[uuid.UUID(i) for i in plan.fold_ids]).order_by("seq")
    )
    text, _scores = _write_summary(
        session=session,
        thread=thread,
        summarizer="local",
        plan=plan,
        events=events,
        folded=folded,
    )
    counter = tokens.counter_for_model(session.model)
    cost = tokens.message_tokens(counter, role="system", content=text)
    folding = set(plan.fold_ids)
    kept = [e.token_count for e in events if e.id not in folding]
    return replace(plan, tokens_after=tokens.context_tokens([*kept, cost]))


def compaction_request(
    *,
    session: Session,
    user: AbstractBaseUser | AnonymousUser | None,
    trigger: str = Trigger.MANUAL,
    strategy: str | None = None,
    summarizer: str | None = None,
    target_ratio: float | None = None,
    enqueue: bool = True,
    thread: str = "",
) -> CompactionRun:
    """Create a pending run and enqueue its task after commit; 409 if one is already active."""
    _check_choice(strategy, STRATEGY_NAMES, "strategy")
    _check_choice(summarizer, SUMMARIZER_NAMES, "summarizer")
    if target_ratio is not None and not 0 < target_ratio <= 1:
        raise InvalidInput(
            "targetRatio must be in (0, 1]", fields={"targetRatio": "must be in (0, 1]"}
        )
    if trigger == Trigger.REFRESH:
        strategy = "summarize"
    try:
        with transaction.atomic():
            run = CompactionRun.objects.create(
                session=session,
                strategy=strategy or SessionSettings.of(session.settings).strategy,
                summarizer=summarizer or SessionSettings.of(session.settings).summarizer,
                trigger=trigger,
                requested_by=user if user is not None and user.is_authenticated else None,  # type: ignore[misc]
                target_ratio=target_ratio,
                thread=thread,
            )
    except IntegrityError:
        if recover_stale_run(session_id=session.pk):
            # The active run had lost its worker and is failed now: the session is free.
            return compaction_request(
                session=session,
                user=user,
                trigger=trigger,
                strategy=strategy,
                summarizer=summarizer,
                target_ratio=target_ratio,
                enqueue=enqueue,
                thread=thread,
            )
        active = CompactionRun.objects.filter(session=session, status__in=ACTIVE_STATUSES).first()
        raise Conflict(
            "a compaction is already pending or running for this session",
            code="compaction_in_progress",
            compactionId=str(active.id) if active else None,
        ) from None
    if enqueue:
        enqueue_run_on_commit(run.pk)
    return run


def _running_summary(session: Session) -> RunningSummary:
    summary, _ = RunningSummary.objects.get_or_create(session=session)
    return summary


def broadcast_usage(session: Session) -> None:
    """Push the session's usage document (USAGE_UPDATED) to everyone watching it: exactly
    REST /usage's (the main thread's context, the session's bill)."""
    broadcast.broadcast(
        session_id=session.pk, owner_id=session.owner_id, message=messages.usage_updated(session)
    )


# One announcement at a time in this process: the embedded profile's server and worker thread
# share it (SQLite has no row lock, and its IMMEDIATE transactions would hold every writer).
_announcing_lock = threading.Lock()


@contextmanager
def _announcing(session_id: uuid.UUID) -> Iterator[Session | None]:
    """The session read afresh (None: deleted since) for announcing a run's outcome, the push
    sent before the next announcement reads. A run's announcement and a revert's each read
    the session and send inside this; across processes under the session's row lock, which a
    revert holds until it commits. So a usage document read before a revert cannot reach
    watchers after the revert's own, leaving them on figures that are no longer true."""
    with _announcing_lock:
        if not db.connection.features.has_select_for_update:
            yield Session.objects.filter(pk=session_id).first()
            return
        with transaction.atomic():
            yield Session.objects.select_for_update().filter(pk=session_id).first()


def _refresh_active_counters(session_id: uuid.UUID) -> Session:
    """Recount the active-context counters (sessions_app's write). The caller holds the
    session row lock."""
    return session_recount_active(session_id=session_id)


def _write_summary(
    *,
    session: Session,
    thread: str,
    summarizer: str,
    plan: Plan,
    events: Sequence[PlanEvent],
    folded: Sequence[Event],
) -> tuple[str, dict[str, int]]:
    """The new running summary a summarize plan calls for (the run's, and the dry run's when
    its summarizer is the offline `local` one, so the projection is the run), and what each
    of its items scored (kept with the summary, so the next run does not let a weaker new
    item evict a stronger old one)."""
    counter = tokens.counter_for_model(session.model)
    writer = build_summarizer(summarizer, count_tokens=counter.count)
    # A summary never costs more than the events it replaces (the previous summary among
    # them): a compaction must not grow the context, whatever budget it may fill. Within
    # that, it fills the reserve the plan gave it (the room, or maxSummaryTokens).
    freed = sum(event.effective_token_count for event in folded)
    budget_text = max(plan.summary_reserve_tokens - SUMMARY_MESSAGE_OVERHEAD, 1)
    max_tokens = min(budget_text, max(freed - SUMMARY_MESSAGE_OVERHEAD, 1))
    # A thread's run extends its own latest summary, never another thread's.
    previous = (
        thread_scope.previous_summary(session=session, thread=thread)
        if thread
        else _running_summary_text(session)
    )
    summary_text = writer.summarize(
        previous_summary=previous,
        messages=_summary_messages(folded),
        max_tokens=max_tokens,
        kept_text=_kept_text(events, plan),
        context=_context_messages(events),
        previous_scores=thread_scope.summary_scores(session=session, thread=thread, text=previous),
    ).strip()
    if not summary_text:
        raise SummarizerError("the summarizer returned an empty summary", permanent=True)
    # Hold the whole summary message within the plan's reserve so tokens_after is a bound.
    return (
        tokens.truncate_to_tokens(summary_text, max_tokens=max_tokens, count_tokens=counter.count),
        dict(writer.chosen_scores),
    )


def _running_summary_text(session: Session) -> str:
    summary = RunningSummary.objects.filter(session=session).only("summary").first()
    return summary.summary if summary is not None else ""


def _summary_messages(events: Sequence[Event]) -> list[SummaryMessage]:
    messages = []
    for event in events:
        if event.type == EventType.COMPACTION:
            continue  # its text is the previous summary, passed separately
        content = event_content(event)
        messages.append(
            SummaryMessage(
                event_id=str(event.id),
                type=event.type,
                role=event.role,
                content=content if isinstance(content, str) else str(content),
                name=event.name,
                seq=event.seq,
                tool_call_id=event.tool_call_id,
            )
        )
    return messages


_ROLES: dict[str, str] = {
    EventType.SYSTEM_PROMPT: "system",
    EventType.USER_MESSAGE: "user",
    EventType.CONTEXT_REFRESH: "user",
    EventType.AGENT_MESSAGE: "assistant",
    EventType.TOOL_CALL: "assistant",
    EventType.TOOL_RESULT: "tool",
}


def _context_messages(events: Sequence[PlanEvent]) -> list[SummaryMessage]:
    """The whole conversation the run sees, in order (the summarizer reads what each folded
    output answered and what was said of it later from it)."""
    return [
        SummaryMessage(
            event_id=e.id,
            type=e.type,
            role=_ROLES.get(e.type, "user"),
            content=e.content,
            name=e.name,
            seq=e.seq,
            tool_call_id=e.tool_call_id,
        )
        for e in events
        if e.type != EventType.COMPACTION
    ]


def _kept_text(events: Sequence[PlanEvent], plan: Plan) -> str:
    """The text the model still sees verbatim after the plan (the summarizer need not repeat
    it): every event not folded, with cleared tool results as their placeholders."""
    folding = set(plan.fold_ids)
    placeholders = {c.event_id: c.placeholder for c in plan.cleared}
    return "\n".join(
        placeholders.get(e.id, e.content)
        for e in events
        if e.id not in folding and e.type != EventType.COMPACTION
    )


def _loss_report(
    events: Sequence[PlanEvent], plan: Plan, *, fold_ids: set[str], summary: str
) -> dict[str, Any]:
    """The evidence in the events a run folds or clears, and which of it the new active
    context (the summary plus every event left, cleared ones as placeholders) still holds."""
    cleared = {c.event_id: c.placeholder for c in plan.cleared}
    gone = [
        (e.seq, e.content)
        for e in events
        if (e.id in fold_ids or e.id in cleared) and e.type != EventType.COMPACTION
    ]
    active = [summary] if summary else []
    active += [
        cleared.get(e.id, e.content)
        for e in events
        if e.id not in fold_ids and e.type != EventType.COMPACTION
    ]
    return evidence.loss_report(folded=gone, active=active)


def compaction_execute(
    *, run_id: uuid.UUID | str, final_attempt: bool = True, attempt: int | None = None
) -> CompactionRun:
    """Execute a pending run (the Celery task's body). Idempotent: a finished run is returned
    unchanged. A transient provider error raises TransientCompactionError unless this is the
    final attempt, in which case the run fails cleanly like a permanent error.

    `attempt` is the number of earlier attempts this delivery follows (the task's retry
    count). A delivery that finds more attempts recorded is a duplicate — the broker
    redelivered the task after its visibility timeout, or the sweeper re-queued a run whose
    task was only late — and leaves the run to the delivery that started it (or, if that one
    died, to the sweeper)."""
    with transaction.atomic():
        run = CompactionRun.objects.select_for_update().select_related("session").get(pk=run_id)
        if run.status in (RunStatus.COMPLETED, RunStatus.FAILED):
            return run
        if attempt is not None and run.attempts > attempt:
            logger.info("compaction %s: duplicate delivery ignored", run_id)
            return run
        first_start = run.status == RunStatus.PENDING
        run.status = RunStatus.RUNNING
        run.started_at = run.started_at or timezone.now()
        run.heartbeat_at = timezone.now()
        run.attempts += 1
        run.save(update_fields=["status", "started_at", "heartbeat_at", "attempts"])
    session = run.session
    if first_start:
        broadcast.broadcast(
            session_id=session.pk, owner_id=session.owner_id, message=messages.compaction_start(run)
        )
    try:
        with beating(run.pk):
            run = _execute(run)
    except SummarizerError as exc:
        if not exc.permanent and not final_attempt:
            raise TransientCompactionError(str(exc)) from exc
        run = _fail(run, f"{run.summarizer} summarizer failed: {exc}")
    except Exception as exc:
        logger.exception("compaction %s failed", run.id)
        run = _fail(run, f"compaction failed: {exc.__class__.__name__}: {exc}")
    return run


def _fail(run: CompactionRun, error: str) -> CompactionRun:
    # Only a run still running fails: a duplicate delivery that errors must not turn the
    # other delivery's completed run into a failed one.
    # The run's status and the session's lastCompaction change together, so a client that
    # sees the run failed also sees it on the session.
    with transaction.atomic():
        failed = CompactionRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED, error=error[:2000], finished_at=timezone.now()
        )
        run.refresh_from_db()
        if not failed:
            return run
        session_record_compaction(session_id=run.session_id, snapshot=run_snapshot(run))
    telemetry.run_span(run)
    session = run.session
    broadcast.broadcast(
        session_id=session.pk,
        owner_id=session.owner_id,
        message=messages.compaction_complete(run),
    )
    return run


# How long a run whose summary is written keeps trying to apply it while the database is away.
DB_RECONNECT_SECONDS = 60.0


def _on_a_fresh_connection(apply: Callable[[], T], *, what: str) -> T:
    """`apply()` (one transaction), tried again on a fresh connection while the database
    connection is lost: a PostgreSQL restart leaves the pool's connections stale
    (`terminating connection due to administrator command`) and refuses new ones for a few
    seconds. The transaction either committed or changed nothing, and a run applies once
    (a second try finds it finished), so trying again is safe."""
    deadline = time.monotonic() + DB_RECONNECT_SECONDS
    delay = 0.25
    while True:
        try:
            return apply()
        except (db.OperationalError, db.InterfaceError) as exc:
            if db.connection.in_atomic_block or time.monotonic() + delay > deadline:
                raise
            logger.warning("%s: the database connection was lost (%s); trying again", what, exc)
            db.connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _execute(run: CompactionRun) -> CompactionRun:
    session = Session.objects.get(pk=run.session_id)
    counter = tokens.counter_for_model(session.model)
    target_ratio = run.target_ratio
    events = _plan_events(session, run.thread)
    plan = plan_compaction(
        strategy=run.strategy,
        events=events,
        budget=_budget(session, target_ratio=target_ratio, strict=_strict(run)),
        count_tokens=counter.count,
    )
    tokens_before = session.context_tokens
    events_before = session.active_event_count
    if run.thread:
        # A thread's run reports on the thread's own context.
        tokens_before, events_before = plan.tokens_before, plan.events_before
    fold_ids = [uuid.UUID(i) for i in plan.fold_ids]
    folded = list(Event.objects.filter(pk__in=fold_ids).order_by("seq"))

    summary_text = ""
    summary_scores: dict[str, int] = {}
    if plan.needs_summary and folded:
        summary_text, summary_scores = _write_summary(
            session=session,
            thread=run.thread,
            summarizer=run.summarizer,
            plan=plan,
            events=events,
            folded=folded,
        )

    report = _loss_report(events, plan, fold_ids=set(plan.fold_ids), summary=summary_text)

    if folded and not plan.is_empty:
        memory_flush.send(sender=CompactionRun, session_id=session.pk, run_id=run.pk, events=folded)
        enqueue_memory_flush(run_id=run.pk, event_ids=[str(e.pk) for e in folded])

    # The summary is written (the slow, paid part): a database restart now (the pool's
    # connections stale, new ones refused for a few seconds) must not lose it (issue 42, row 10).
    return _on_a_fresh_connection(
        lambda: _apply(
            run=run,
            session=session,
            counter=counter,
            events=events,
            plan=plan,
            fold_ids=fold_ids,
            folded=folded,
            summary_text=summary_text,
            summary_scores=summary_scores,
            report=report,
            tokens_before=tokens_before,
            events_before=events_before,
        ),
        what=f"compaction {run.pk}",
    )


def _apply(
    *,
    run: CompactionRun,
    session: Session,
    counter: Any,
    events: list[PlanEvent],
    plan: Plan,
    fold_ids: list[uuid.UUID],
    folded: list[Event],
    summary_text: str,
    summary_scores: dict[str, int],
    report: dict[str, Any] | None,
    tokens_before: int,
    events_before: int,
) -> CompactionRun:
    """Apply a run's plan in one transaction (the session locked, then the run)."""
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        # acks_late may deliver the task twice; whichever delivery gets here second finds the
        # run finished and applies nothing (same lock order as revert: session, then run).
        current_run = CompactionRun.objects.select_for_update().get(pk=run.pk)
        if current_run.status != RunStatus.RUNNING:
            return current_run
        if plan.is_empty and run.trigger != Trigger.REFRESH:
            # Nothing to fold: no COMPACTION event, so a no-op run (e.g. /context at the hard
            # limit with only must-keep events) leaves the ledger as it was.
            return _complete(
                run,
                session=locked,
                tokens_before=tokens_before,
                events_before=events_before,
                marker=None,
                folded_count=0,
                previous=None,
                summary_tokens=None,
                loss_report=report,
            )
        # Re-check the plan against the events now: anything pinned or folded since planning
        # stays, together with its tool-call partners.
        current = {e.pk: e for e in Event.objects.filter(pk__in=fold_ids).select_for_update()}
        blocked_calls = {
            e.tool_call_id
            for e in current.values()
            if (e.pinned or e.compacted_by_id) and e.tool_call_id
        }
        final_ids = [
            pk
            for pk, e in current.items()
            if not e.pinned and e.compacted_by_id is None and e.tool_call_id not in blocked_calls
        ]
        running = _running_summary(locked)
        previous = running.snapshot()
        marker_content = summary_text if plan.needs_summary else ""
        result = event_append(
            session=locked,
            events=[
                EventInput(
                    type=EventType.COMPACTION,
                    content=marker_content,
                    metadata={
                        "compactionId": str(run.pk),
                        "strategy": run.strategy,
                        "trigger": run.trigger,
                        # The summary belongs to the thread it compacted.
                        **({"thread": run.thread} if run.thread else {}),
                        # What its items scored (the next run's `previous_scores`).
                        **({"summaryScores": summary_scores} if summary_scores else {}),
                    },
                )
            ],
        )
        marker = result.events[0]
        events_fold(event_ids=final_ids, marker=marker)
        events_clear(
            clearings=[
                Clearing(
                    event_id=cleared.event_id,
                    placeholder=cleared.placeholder,
                    token_count=cleared.token_count,
                )
                for cleared in plan.cleared
            ],
            marker=marker,
        )
        if (
            plan.needs_summary
            and final_ids
            and thread_scope.keeps_running_summary(session=locked, thread=run.thread)
        ):
            final = set(final_ids)  # built once: a set per event made this loop quadratic
            folded_messages = [
                e for e in folded if e.pk in final and e.type != EventType.COMPACTION
            ]
            running.summary = summary_text
            running.summarized_message_ids = list(running.summarized_message_ids) + [
                str(e.pk) for e in folded_messages
            ]
            if folded_messages:
                running.last_summarized_message_id = folded_messages[-1].pk
            # The summary's own size (what maxSummaryTokens bounds); the COMPACTION event's
            # tokenCount adds the message framing.
            running.token_count = counter.count(summary_text)
            running.save()
        if run.trigger == Trigger.REFRESH:
            event_append(
                session=locked,
                events=[
                    EventInput(
                        type=EventType.CONTEXT_REFRESH,
                        content=f"{REFRESH_PREFIX} The conversation so far is summarized above. "
                        "Continue from the latest request.",
                    )
                ],
            )
        if {str(pk) for pk in final_ids} != set(plan.fold_ids):
            # Something was pinned or folded since planning: report on what really went.
            report = _loss_report(
                events, plan, fold_ids={str(pk) for pk in final_ids}, summary=summary_text
            )
        return _complete(
            run,
            session=locked,
            tokens_before=tokens_before,
            events_before=events_before,
            marker=marker,
            folded_count=len(final_ids) + len(plan.cleared),
            previous=previous,
            # The summary's own size, as GET /summary reports it (tokenCount), without the
            # message framing the COMPACTION event's count adds.
            summary_tokens=counter.count(summary_text) if plan.needs_summary else None,
            loss_report=report,
        )


def _complete(
    run: CompactionRun,
    *,
    session: Session,
    tokens_before: int,
    events_before: int,
    marker: Event | None,
    folded_count: int,
    previous: dict[str, Any] | None,
    summary_tokens: int | None,
    loss_report: dict[str, Any] | None = None,
) -> CompactionRun:
    """Finish a run inside the apply transaction (the caller holds the session lock)."""
    locked = _refresh_active_counters(session.pk)
    run.status = RunStatus.COMPLETED
    run.tokens_before = tokens_before
    run.tokens_after = locked.context_tokens
    run.events_before = events_before
    run.events_after = locked.active_event_count
    if run.thread:
        after = _plan_events(locked, run.thread)
        run.tokens_after = context_cost(after)
        run.events_after = len(after)
    run.summary_tokens = summary_tokens
    run.folded_count = folded_count
    run.compaction_event = marker
    run.previous_summary = previous
    run.loss_report = loss_report
    run.finished_at = timezone.now()
    run.save()
    session_record_compaction(session_id=locked.pk, snapshot=run_snapshot(run))
    counts = {"originalTokenCount": tokens_before, "compressedTokenCount": run.tokens_after}
    run_id, session_id = run.pk, locked.pk

    def after_commit() -> None:
        # Logged once the run is durable; the counts ride along as fields for JSON logging.
        audit.info(
            "context:compressed %s",
            counts,
            extra={"session_id": str(session_id), "compaction_id": str(run_id), **counts},
        )
        _announce_complete(run_id)

    transaction.on_commit(after_commit)
    return run


def _announce_complete(run_id: uuid.UUID) -> None:
    run = CompactionRun.objects.select_related("session").get(pk=run_id)
    with _announcing(run.session_id) as session:
        if session is not None:
            broadcast.broadcast(
                session_id=session.pk,
                owner_id=session.owner_id,
                message=messages.compaction_complete(run),
            )
            broadcast_usage(session)
    telemetry.run_span(run)


def compaction_revert(*, run: CompactionRun) -> CompactionRun:
    """Undo the session's latest completed run: its folded events become active again, cleared
    tool results get their content back, and the running summary returns to what it was."""
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=run.session_id)
        run = CompactionRun.objects.select_for_update().get(pk=run.pk)
        latest = latest_revertible_run(session=locked)
        if latest is None or latest.pk != run.pk or run.compaction_event_id is None:
            raise Conflict(
                "only the session's latest completed compaction can be reverted"
                + (f": that is {latest.pk}" if latest is not None else "; there is none"),
                code="not_revertible",
                revertibleCompactionId=str(latest.pk) if latest is not None else None,
            )
        tokens_before = locked.context_tokens
        if CompactionRun.objects.filter(session=locked, status__in=ACTIVE_STATUSES).exists():
            raise Conflict("a compaction is pending or running", code="compaction_in_progress")
        compaction_undo(
            session=locked,
            marker_id=run.compaction_event_id,
            refresh=run.trigger == Trigger.REFRESH,
        )
        previous = run.previous_summary or {}
        if "summary" in previous:
            running = _running_summary(locked)
            running.summary = previous.get("summary", "")
            running.summarized_message_ids = previous.get("summarizedMessageIds", [])
            last = previous.get("lastSummarizedMessageId")
            running.last_summarized_message_id = uuid.UUID(last) if last else None
            running.token_count = previous.get("tokenCount", 0)
            running.save()
        locked = _refresh_active_counters(locked.pk)
        run.reverted_at = timezone.now()
        run.save(update_fields=["reverted_at"])
        session_record_compaction(
            session_id=locked.pk, snapshot={**run_snapshot(run), "reverted": True}
        )
        reverted_message = messages.compaction_reverted(
            session_id=locked.pk,
            compaction_id=run.pk,
            tokens_before=tokens_before,
            tokens_after=locked.context_tokens,
        )
        session_id, owner_id = locked.pk, locked.owner_id

        def announce() -> None:
            with _announcing(session_id) as current:
                broadcast.broadcast(
                    session_id=session_id, owner_id=owner_id, message=reverted_message
                )
                if current is not None:
                    broadcast_usage(current)

        transaction.on_commit(announce)
    return run


def maybe_auto_compact(
    *, session_id: uuid.UUID, session: Session | None = None
) -> CompactionRun | None:
    """After an append: start a refresh when the cumulative counter crossed its threshold, or
    an auto compaction when the context crossed the compact threshold (at most once per
    cooldown), or, within the cooldown, a `hard_limit` one when it crossed the hard limit.
    `session` is the row as the append committed it, when the caller has it.
    Never raises: a failure here must not reach the appending client."""
    try:
        if session is None:
            session = Session.objects.get(pk=session_id)
        settings = SessionSettings.of(session.settings)
        threshold = settings.refresh_threshold_tokens
        # Reset first, conditionally: of concurrent appenders only one wins the update.
        if session.cumulative_tokens >= threshold and session_take_cumulative(
            session_id=session_id, threshold=threshold
        ):
            try:
                return compaction_request(session=session, user=None, trigger=Trigger.REFRESH)
            except (Conflict, ServiceUnavailable):
                # Postponed, not lost: give the tokens back so the next append after the
                # active run (or the broker's return) retries the refresh.
                session_give_back_cumulative(
                    session_id=session_id, tokens=session.cumulative_tokens
                )
                logger.info("refresh for %s postponed: a compaction is already active", session_id)
                return None
        policy = Policy.of(settings)
        level = session.window_level()
        if not policy.auto_compact or not level.near_limit:
            return None
        if Thread.objects.filter(session_id=session_id).exists():
            # The gateway compacts its threads in the call path, each when it crosses the
            # threshold (docs/fitting.md); a run here, judged on the whole ledger (side
            # threads included), would only break the forwarded prefix in between.
            return None
        autos = CompactionRun.objects.filter(session=session, trigger=Trigger.AUTO)
        decision = policy.auto_trigger(
            level=level,
            last_auto_at=autos.order_by("-created_at").values_list("created_at", flat=True).first(),
            auto_active=autos.filter(status__in=ACTIVE_STATUSES).exists(),
            now=timezone.now(),
            auto=Trigger.AUTO,
            hard_limit=Trigger.HARD_LIMIT,
        )
        if decision.trigger is None:
            return None
        trigger = decision.trigger
        if decision.needs_plan and compaction_plan(session=session).plan.is_empty:
            return None
        if CompactionRun.objects.filter(
            session=session, status__in=ACTIVE_STATUSES
        ).exists() and not _recovered(session):
            return None  # another run is on it; nothing is about to start
        # Announced before the run is queued, so a watcher can pin what must stay.
        broadcast.broadcast(
            session_id=session.pk,
            owner_id=session.owner_id,
            message=messages.compaction_pending(session),
        )
        try:
            return compaction_request(session=session, user=None, trigger=trigger)
        except (Conflict, ServiceUnavailable):
            return None  # ServiceUnavailable: logged by enqueue_run; the next append retries
    except Exception:
        logger.exception("auto compaction check failed for session %s", session_id)
        return None


def _recovered(session: Session) -> bool:
    return recover_stale_run(session_id=session.pk)


def hard_limit_cooling_down(*, session: Session) -> bool:
    """Whether the session had a hard-limit run within its `cooldownSeconds`: POST /context
    then prunes instead of compacting again, so a client polling it cannot compact per call."""
    cooldown = SessionSettings.of(session.settings).cooldown_seconds
    since = timezone.now() - timedelta(seconds=cooldown)
    return CompactionRun.objects.filter(
        session=session, trigger=Trigger.HARD_LIMIT, created_at__gte=since
    ).exists()


def compaction_run_sync(
    *,
    session: Session,
    user: AbstractBaseUser | AnonymousUser | None,
    trigger: str = Trigger.HARD_LIMIT,
    target_ratio: float | None = None,
    thread: str = "",
) -> CompactionRun | None:
    """Request and execute a run in this thread (the /context hard-limit path). `target_ratio`
    is the low-water mark the run compacts down to (the gateway's `fitTargetRatio`).

    Plans first: when the session's strategy would fold and clear nothing, no run is created
    and None is returned, so a read that reaches the hard limit writes (and broadcasts)
    nothing needlessly; the caller prunes instead."""
    strict = target_ratio is not None and trigger in (Trigger.GATEWAY, Trigger.HARD_LIMIT)
    # The session's strategy, in the call path as on /context: `summarize` by default. (The
    # gateway once cleared old tool results first whenever that alone reached the mark; at
    # the same mark the bounded summary with the newest turns verbatim keeps more facts, and
    # a session that wants observation masking sets `strategy: clear_tool_results`.)
    if compaction_plan(
        session=session,
        target_ratio=target_ratio,
        strict=strict,
        thread=thread,
    ).plan.is_empty:
        return None
    run = compaction_request(
        session=session,
        user=user,
        trigger=trigger,
        target_ratio=target_ratio,
        enqueue=False,
        thread=thread,
    )
    return compaction_execute(run_id=run.pk, final_attempt=True)
