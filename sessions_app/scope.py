"""The scope rule, written once: what each figure counts, and the one selector per figure that
every surface reads (REST `/usage`, `USAGE_UPDATED`, the dashboard, MCP, the admin).

* **Context figures** (what the model sees: `contextTokens`, `contextLimit`, `percentUsed`,
  `nearLimit`, `atLimit`, and the schedule derived from them) are per *thread*, the main
  thread by default (`?thread=` picks another). A session with one writer (no gateway
  threads, or one) has one conversation: its context is the ledger's active context. With
  several writers the ledger interleaves them, so a thread's context is what its last call
  forwarded (its compactions update it too).
* **Bill figures** (provider-reported tokens, cost, cache reads and writes, calls) are per
  *session*, across every thread, and count every call the provider answered, retries
  included (a provider bills each one, even when the ledger already held the reply). Calls the
  provider did not answer (refused, failed, unreachable) are counted apart (`failedCalls`) and
  add nothing to the bill. A cost is the known sum; calls whose model has no price are
  counted (`unpricedCalls`) and named (`costUnknownReason`), never turning the sum into
  "unknown".

Every document says which scope its figures have (`scope`). Reads only: the counters are
kept by the append engine and the gateway's services.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Q

from sessions_app import pricing
from sessions_app.context_window import WindowLevel
from sessions_app.errors import NotFound
from sessions_app.models import ERROR_STATUSES, Call, Session, Thread
from sessions_app.session_settings import SessionSettings
from sessions_app.threads import session_threads

logger = logging.getLogger("sessions_app")

# What `scope` says in every usage document.
CONTEXT_SCOPE = "thread"
BILL_SCOPE = "session"


# --- context figures (per thread) ----------------------------------------------------------------


@dataclass(frozen=True)
class ContextFigures:
    """What one thread's model sees, against the session's context limit: the thread's key
    ("" when the session has no gateway threads: the whole ledger) and its window level
    (context_window.window_level, the one window computation)."""

    thread: str
    level: WindowLevel

    @property
    def context_tokens(self) -> int:
        return self.level.tokens

    @property
    def context_limit(self) -> int:
        return self.level.window

    @property
    def percent_used(self) -> float:
        return self.level.percent_used

    @property
    def near_limit(self) -> bool:
        return self.level.near_limit

    @property
    def at_limit(self) -> bool:
        return self.level.at_limit

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "contextTokens": self.level.tokens,
            "contextLimit": self.level.window,
            "percentUsed": self.level.percent_used,
            "nearLimit": self.level.near_limit,
            "atLimit": self.level.at_limit,
        }
        if self.thread:
            out["thread"] = self.thread
        return out


# Which threads a session has, kept in the cache so that a usage push costs no query for the
# many sessions with none or one: "" none, "1:<key>" one, "n" several. Forgotten whenever a
# thread is created (services.thread_get_or_create).
_THREADS_KEY = "ledger:threads:{}"


def forget_threads(*, session_id: Any) -> None:
    try:
        cache.delete(_THREADS_KEY.format(session_id))
    except Exception:
        logger.warning("thread cache: forgetting session %s failed", session_id)


def _remember_threads(session_id: Any, value: str) -> None:
    try:
        cache.set(_THREADS_KEY.format(session_id), value, timeout=3600)
    except Exception:
        logger.warning("thread cache: remembering session %s failed", session_id)


def _threads_hint(session: Session) -> str | None:
    try:
        known = cache.get(_THREADS_KEY.format(session.pk))
    except Exception:
        return None
    return known if isinstance(known, str) else None


def context_figures(
    *, session: Session, thread: str | None = None, threads: list[Thread] | None = None
) -> ContextFigures:
    """The context figures of `thread` (its key; None: the main thread). `threads`: the
    session's threads when the caller has them (main first). An unknown key is NotFound."""

    def figures(key: str, tokens: int) -> ContextFigures:
        return ContextFigures(thread=key, level=session.window_level(tokens))

    if threads is None and thread is None:
        hint = _threads_hint(session)
        if hint == "":
            return figures("", session.context_tokens)
        if hint is not None and hint.startswith("1:"):
            return figures(hint[2:], session.context_tokens)
    if threads is None:
        threads = session_threads(session=session)
        _remember_threads(
            session.pk, "" if not threads else f"1:{threads[0].key}" if len(threads) == 1 else "n"
        )
    if thread is not None:
        chosen = next((t for t in threads if t.key == thread), None)
        if chosen is None:
            raise NotFound("thread not found")
    elif threads:
        chosen = threads[0]
    else:
        return figures("", session.context_tokens)
    if len(threads) < 2:
        # One writer: its conversation is the ledger's active context.
        return figures(chosen.key, session.context_tokens)
    return figures(chosen.key, chosen.context_tokens)


# --- bill figures (per session) ------------------------------------------------------------------


@dataclass(frozen=True)
class BillFigures:
    """The provider's bill for a session: every thread, every call the provider answered."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Events that carry provider usage (a ledger figure: a retried call's reply is one event).
    reported_events: int
    cached_input_tokens: int
    cache_write_tokens: int
    cost_nano_usd: int
    unpriced_calls: int
    unpriced_model: str
    saved_tokens: int
    saved_nano_usd: int
    # Gateway calls: answered by the provider (billed) and not (failures, refusals).
    calls: int = 0
    failed_calls: int = 0

    @property
    def cost_usd(self) -> float:
        """The known sum (calls without a price add nothing; see unpriced_calls)."""
        return pricing.usd(self.cost_nano_usd)

    @property
    def saved_usd(self) -> float:
        return pricing.usd(self.saved_nano_usd)

    @property
    def cache_hit_rate(self) -> float | None:
        return pricing.hit_rate(cached=self.cached_input_tokens, input_tokens=self.prompt_tokens)

    @property
    def cost_unknown_reason(self) -> str | None:
        if not self.unpriced_calls:
            return None
        return (
            f"{unpriced_text(self.unpriced_calls)} "
            f"(no price is known for model {self.unpriced_model!r})"
        )

    def document(self) -> dict[str, Any]:
        return {
            "totalPromptTokens": self.prompt_tokens,
            "totalCompletionTokens": self.completion_tokens,
            "totalTokens": self.total_tokens,
            "reportedEventCount": self.reported_events,
            "calls": self.calls,
            "failedCalls": self.failed_calls,
            "cachedInputTokens": self.cached_input_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "cacheHitRate": self.cache_hit_rate,
            "costUsd": self.cost_usd,
            "unpricedCalls": self.unpriced_calls,
            "costUnknownReason": self.cost_unknown_reason,
            "savedTokens": self.saved_tokens,
            "savedUsd": self.saved_usd,
        }


def unpriced_text(count: int) -> str:
    """ "1 call with no price", "3 calls with no price"."""
    return f"{count:,} call{'s' if count != 1 else ''} with no price"


def call_counts(*, session: Session) -> tuple[int, int]:
    """(calls the provider answered, calls it did not) of the session's gateway calls."""
    counts = Call.objects.filter(session=session).aggregate(
        calls=Count("id"), failed=Count("id", filter=Q(status__in=ERROR_STATUSES))
    )
    failed = counts["failed"] or 0
    return (counts["calls"] or 0) - failed, failed


def bill_figures(*, session: Session, with_calls: bool = True) -> BillFigures:
    """The session's bill from its counters (O(1)); `with_calls` adds the gateway's call
    counts (one indexed aggregate)."""
    calls, failed = call_counts(session=session) if with_calls else (0, 0)
    return BillFigures(
        prompt_tokens=session.reported_prompt_tokens,
        completion_tokens=session.reported_completion_tokens,
        total_tokens=session.reported_total_tokens,
        reported_events=session.reported_event_count,
        cached_input_tokens=session.reported_cached_input_tokens,
        cache_write_tokens=session.reported_cache_write_tokens,
        cost_nano_usd=session.cost_nano_usd,
        unpriced_calls=session.unpriced_calls,
        unpriced_model=session.unpriced_model,
        saved_tokens=session.saved_tokens,
        saved_nano_usd=session.saved_nano_usd,
        calls=calls,
        failed_calls=failed,
    )


def thread_bill(thread: Thread) -> dict[str, Any]:
    """One thread's share of the bill (its calls and their provider-reported tokens)."""
    return {
        "thread": thread.key,
        "calls": thread.calls,
        "promptTokens": thread.prompt_tokens,
        "completionTokens": thread.completion_tokens,
        "totalTokens": thread.prompt_tokens + thread.completion_tokens,
    }


# --- the usage document --------------------------------------------------------------------------


def usage_document(
    *,
    session: Session,
    thread: str | None = None,
    threads: list[Thread] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`GET /usage` (and `USAGE_UPDATED`'s `usage`, MCP's `ledger_usage`, the dashboard's
    figures): the context figures of `thread` (None: the main thread), the session's bill, and
    the session's own figures. `extra`: figures the caller computed (the count's exactness)."""
    settings = SessionSettings.of(session.settings)
    context = context_figures(session=session, thread=thread, threads=threads)
    bill = bill_figures(session=session)
    document: dict[str, Any] = {
        **bill.document(),
        **context.document(),
        "model": session.model,
        "encoding": session.encoding,
        "cumulativeTokens": session.cumulative_tokens,
        "refreshThresholdTokens": settings.refresh_threshold_tokens,
        "lastCompaction": session.last_compaction,
        "lastProviderPromptTokens": session.last_provider_prompt_tokens,
        "countDriftPercent": count_drift_percent(session=session),
        "scope": {"context": CONTEXT_SCOPE, "thread": context.thread, "bill": BILL_SCOPE},
        **(extra or {}),
    }
    if context.thread and thread is not None:
        found = next(
            (t for t in (threads or session_threads(session=session)) if t.key == thread), None
        )
        if found is not None:
            document["threadBill"] = thread_bill(found)
    return document


def count_drift_percent(*, session: Session) -> float | None:
    """How far the provider's reported prompt tokens for the last gateway call were from our
    count of what was forwarded: 100 × (provider − ours) / ours, one decimal."""
    ours, theirs = session.last_forwarded_tokens, session.last_provider_prompt_tokens
    if not ours or theirs is None:
        return None
    return round(100 * (theirs - ours) / ours, 1)
