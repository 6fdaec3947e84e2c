"""A compaction's economics: what it sheds from every later call, the cache write it causes,
how many calls it takes to pay that back, and — measured on the gateway calls of its thread
until the next compaction — the net dollars it saved (or cost).

Compacting the middle of a history changes the prompt's prefix: the next call cannot read
what the provider cached and writes the new prefix again (Anthropic bills a 5-minute write
at 1.25× the input rate, OpenAI bills the miss at the full input rate), while every later
call reads fewer tokens. So a compaction pays when the tokens it sheds, read on each later
call at the cache-read rate, outweigh that one write.

Predicted (when the run completes, at the session's model prices, a warm cache assumed):
- `tokensShedPerCall` = tokensBefore − tokensAfter;
- `cacheWriteTokens` = the new prefix the next call writes: tokensAfter less the part the
  compaction kept in front (the system prompt), and `cacheWriteUsd` its price at the write
  rate; `cacheWritePremiumUsd` what that write costs beyond reading those tokens;
- `savingPerCallUsd` = tokensShedPerCall at the cache-read rate;
- `paybackCalls` = ⌈premium ÷ saving per call⌉ (null when nothing is shed).

Measured (each gateway call of the run's thread after it, until the thread's next
compaction; `record_call`): the call's price against the same call without the compaction —
the shed tokens added back (read from the cache when the call read from it, else at the input
rate) and, on the first call, the rewritten prefix read instead of written — summed as
`measured.netUsd` (positive: the compaction saved money). Calls whose usage the provider did
not report, or whose model has no price, are not counted.
"""

from __future__ import annotations

import logging
import math
from decimal import Decimal
from typing import Any

from django.db.models import F

from compaction_app.models import CompactionRun, RunStatus
from sessions_app import pricing
from sessions_app.models import Call, Event, EventType, Session
from sessions_app.services import session_add_compaction_net

logger = logging.getLogger("compaction_app")


def _usd(amount: Decimal) -> float:
    return float(round(amount, 9))


def _head_tokens(run: CompactionRun) -> int:
    """What the run kept in front of the context it changed: the thread's system prompt."""
    events = Event.objects.filter(
        session_id=run.session_id, type=EventType.SYSTEM_PROMPT, compacted_by__isnull=True
    )
    if run.thread:
        events = events.filter(metadata__thread=run.thread)
    found = events.order_by("seq").values_list("token_count", flat=True).first()
    return int(found or 0)


def predicted(
    *, tokens_before: int, tokens_after: int, head_tokens: int, rates: pricing.Rates
) -> dict[str, Any]:
    """The run's economics as predicted at the given prices (pure)."""
    shed = max(tokens_before - tokens_after, 0)
    rewrite = max(tokens_after - head_tokens, 0)
    premium = rewrite * (rates.cache_write - rates.cache_read)
    saving = shed * rates.cache_read
    return {
        "tokensShedPerCall": shed,
        "cacheWriteTokens": rewrite,
        "cacheWriteUsd": _usd(rewrite * rates.cache_write),
        "cacheWritePremiumUsd": _usd(premium),
        "savingPerCallUsd": _usd(saving),
        "paybackCalls": math.ceil(premium / saving) if saving > 0 else None,
    }


def document(
    run: CompactionRun, *, session: Session | None = None, closed: bool | None = None
) -> dict[str, Any] | None:
    """The run's `economics` (API, COMPACTION_COMPLETE, session page); None for a run that
    did not complete or changed nothing. `closed`: whether a later compaction of its thread
    ended its measurement (looked up when not given)."""
    if run.status != RunStatus.COMPLETED or run.tokens_before is None or run.tokens_after is None:
        return None
    if not run.folded_count and run.tokens_before == run.tokens_after:
        return None
    session = session or run.session
    found = pricing.rates(session.model)
    doc: dict[str, Any] = {"model": session.model, "priced": found is not None}
    if found is not None:
        doc.update(
            predicted(
                tokens_before=run.tokens_before,
                tokens_after=run.tokens_after,
                head_tokens=_head_tokens(run),
                rates=found,
            )
        )
    else:
        doc.update(
            tokensShedPerCall=max(run.tokens_before - run.tokens_after, 0),
            cacheWriteTokens=None,
            cacheWriteUsd=None,
            cacheWritePremiumUsd=None,
            savingPerCallUsd=None,
            paybackCalls=None,
        )
    if closed is None:
        closed = (
            CompactionRun.objects.filter(
                session_id=run.session_id,
                status=RunStatus.COMPLETED,
                thread=run.thread,
                created_at__gt=run.created_at,
            )
            .exclude(pk=run.pk)
            .exists()
        )
    doc["measured"] = {
        "calls": run.measured_calls,
        "netUsd": pricing.usd(run.measured_net_nano_usd) if run.measured_calls else None,
        "firstCallCacheWriteTokens": run.first_call_write_tokens,
        "complete": closed,
    }
    return doc


# --- measured, one call at a time -----------------------------------------------------------------


def _run_for(call: Call) -> CompactionRun | None:
    """The latest completed compaction of the call's thread (or of the whole ledger) that
    finished before the call's answer was recorded, and was not reverted."""
    if call.session_id is None:
        return None
    return (
        CompactionRun.objects.filter(
            session_id=call.session_id,
            status=RunStatus.COMPLETED,
            thread__in=[call.thread, ""],
            reverted_at__isnull=True,
            finished_at__isnull=False,
        )
        .order_by("-finished_at")
        .first()
    )


def counterfactual_nano(
    *,
    model: str,
    prompt: int,
    cached: int,
    write: int,
    write_1h: int,
    output: int,
    reasoning: int,
    shed: int,
    moved: int,
) -> int | None:
    """The call's price had the compaction not happened (pure): `shed` tokens more in the
    prompt (read from the cache when the call read from it, else fresh input), and `moved`
    tokens of its cache write (or uncached input) read from the cache instead."""
    moved = max(min(moved, prompt - cached), 0)
    from_write = min(moved, write)
    warm = cached > 0 or moved > 0
    usage = pricing.CallUsage(
        input_tokens=prompt + shed,
        cached_input_tokens=cached + moved + (shed if warm else 0),
        cache_write_tokens=write - from_write,
        cache_write_1h_tokens=min(write_1h, write - from_write),
        output_tokens=output,
        reasoning_tokens=reasoning,
    )
    return pricing.price_call(model, usage).nano_usd


def record_call(*, call: Call, cache: dict[str, Any] | None) -> None:
    """Count a gateway call in the economics of the compaction it came after. Never raises."""
    try:
        _record(call, cache)
    except Exception:
        logger.exception("economics: measuring a call against its compaction failed")


def _record(call: Call, cache: dict[str, Any] | None) -> None:
    if (
        call.session_id is None
        or call.usage_status != "reported"
        or call.cost_nano_usd is None
        or not call.prompt_tokens
    ):
        return
    run = _run_for(call)
    if run is None or run.tokens_before is None or run.tokens_after is None:
        return
    shed_ours = max(run.tokens_before - run.tokens_after, 0)
    # The provider counts with its own tokenizer: our counts are scaled by this call's ratio.
    scale = call.prompt_tokens / call.forwarded_tokens if call.forwarded_tokens else 1.0
    first = bool(
        CompactionRun.objects.filter(pk=run.pk, first_call_id__isnull=True).update(
            first_call_id=call.pk, first_call_write_tokens=call.cache_write_tokens
        )
    )
    moved = 0
    if first and cache is not None:
        # What the compaction made the provider write (or read uncached) on this call: the
        # prompt past the part both requests share, less the newest turns (written anyway).
        rewrite = max(
            int(cache.get("promptTokens") or 0)
            - int(cache.get("sharedTokens") or 0)
            - int(cache.get("newTokens") or 0),
            0,
        )
        moved = round(rewrite * scale)
    model = call.model_served or call.model_requested
    counterfactual = counterfactual_nano(
        model=model,
        prompt=call.prompt_tokens,
        cached=call.cached_input_tokens or 0,
        write=call.cache_write_tokens or 0,
        write_1h=call.cache_write_1h_tokens or 0,
        output=call.completion_tokens or 0,
        reasoning=call.reasoning_tokens or 0,
        shed=round(shed_ours * scale),
        moved=moved,
    )
    if counterfactual is None:
        return
    net = counterfactual - call.cost_nano_usd
    CompactionRun.objects.filter(pk=run.pk).update(
        measured_calls=F("measured_calls") + 1,
        measured_net_nano_usd=F("measured_net_nano_usd") + net,
    )
    session_add_compaction_net(session_id=call.session_id, nano_usd=net)  # checked above
