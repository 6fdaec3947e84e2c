"""A call's cache outcome, from the ledger (sync, ORM; run on after.py's worker thread once the
answer is out, never on the call's path): the fingerprint of what the call forwarded, the
previous call of its thread as the ledger kept it (Call.prefix), whether a compaction of ours
changed the thread's history between them, and the prediction (cache_outcome.py) set beside
the provider's figures.

The first call of a thread is compared with the session's latest call in any thread (a side
call or a sub-agent shares its tools and system prompt with the main loop): its reason is
`first_call`, its outcome `partial` when that shared prefix can be read, else `miss`.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

from compaction_app.gateway import cache_outcome
from compaction_app.gateway.cache_outcome import Fingerprint, Outcome, Previous
from compaction_app.gateway.messages import GatewayInputError
from compaction_app.models import CompactionRun, RunStatus
from sessions_app import tokens
from sessions_app.calls import previous_prefix
from sessions_app.models import ROLE_FOR_TYPE, Session

logger = logging.getLogger("compaction_app.gateway")

_EXTENDED_RETENTION = {"24h": 24 * 3600}


@dataclass(frozen=True)
class CacheRecord:
    document: dict[str, Any]
    fingerprint: dict[str, Any]


def _fingerprint(*, wire: Any, body: dict[str, Any], model: str) -> Fingerprint:
    counter = tokens.counter_for_model(model)

    def describe(unit: dict[str, Any], index: int) -> tuple[str, str, Any]:
        message = wire.to_client_message(unit, index)
        rows = [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in message.drafts]
        return message.hash, message.role, rows

    def count(batches: list[Any]) -> list[int]:
        # One batch for every new message (tiktoken encodes a batch at once).
        flat = [row for rows in batches for row in rows]
        costs = iter(tokens.messages_batch_tokens(counter, flat) if flat else [])
        return [sum(next(costs) for _ in rows) for rows in batches]

    parsed = wire.parse_request(body, {"model": model})
    tools = [body[name] for name in ("tools", "functions", "toolConfig") if body.get(name)]
    control = body.get("cache_control")
    retention = body.get("prompt_cache_retention")
    return cache_outcome.fingerprint(
        model=model,
        units=parsed.units,
        tools=tools or None,
        describe=describe,
        count=count,
        count_tools=tokens.non_text_tokens,
        encoding=model,
        auto=(3600 if control.get("ttl") == "1h" else 300) if isinstance(control, dict) else None,
        ttl=_EXTENDED_RETENTION.get(retention) if isinstance(retention, str) else None,
    )


def _previous(
    session: Session, thread: str, before: datetime.datetime
) -> tuple[Previous | None, bool]:
    """The previous call of the thread (same_thread True), else the session's latest."""
    found = previous_prefix(session_id=session.pk, thread=thread, before=before) if thread else None
    same = found is not None
    if found is None:
        found = previous_prefix(session_id=session.pk, thread="", before=before)
    if found is None:
        return None, False
    return (
        Previous.of(
            found.fingerprint,
            at=found.started_at.timestamp(),
            call_id=str(found.call_id),
            thread=found.thread,
        ),
        same,
    )


def _compacted_since(session: Session, thread: str, since: float, until: float) -> bool:
    """Whether a compaction of ours completed for the thread (or the whole ledger) between
    the previous call and this one (a background, manual or REST-triggered run)."""
    return CompactionRun.objects.filter(
        session=session,
        status=RunStatus.COMPLETED,
        thread__in=[thread, ""],
        finished_at__gt=datetime.datetime.fromtimestamp(since, datetime.UTC),
        finished_at__lte=datetime.datetime.fromtimestamp(until, datetime.UTC),
    ).exists()


def cache_record(
    *,
    session: Session,
    wire: Any,
    body: dict[str, Any],
    model: str,
    thread: str,
    started_at: datetime.datetime,
    fit_how: str,
    compacted_now: bool,
    client_body: dict[str, Any] | None = None,
    provider_read: int | None,
    provider_write: int | None,
) -> CacheRecord | None:
    """The call's cache document and the fingerprint to keep; None when the request cannot be
    read back (it was forwarded as the client sent it: the wire checked it then)."""
    try:
        current = _fingerprint(wire=wire, body=body, model=model)
    except (GatewayInputError, KeyError, TypeError, ValueError):
        logger.warning("gateway: the forwarded request could not be fingerprinted")
        return None
    rules = wire.cache_rules(model)
    now = started_at.timestamp()
    previous, same_thread = _previous(session, thread, started_at)
    by_gateway = None
    if fit_how in ("compacted", "pruned") or compacted_now:
        by_gateway = "pruned" if fit_how == "pruned" else "compacted"
    elif (
        previous is not None
        and same_thread
        and session.last_compaction
        and cache_outcome.first_difference(current, previous) < len(previous.digests)
        and _compacted_since(session, thread, previous.at, now)
    ):
        # The history changed, and a compaction of ours (manual, auto, REST) ran since.
        by_gateway = "compacted"
    client_marked = (
        client_body is not None
        and not current.marks()
        and (cache_outcome.marks_in(client_body) is not None)
    )
    if previous is not None and not same_thread and not _continues(current, previous):
        outcome = _first_of_thread(current, previous, now, rules, client_marked)
    else:
        outcome = cache_outcome.predict(
            current=current,
            previous=previous,
            now=now,
            rules=rules,
            compacted_by_gateway=by_gateway,
            client_marked=client_marked,
        )
    document = outcome.document(
        provider_read=provider_read, provider_write=provider_write, rules=rules
    )
    return CacheRecord(document=document, fingerprint=current.stored())


def _continues(current: Fingerprint, previous: Previous) -> bool:
    """Whether a request the ledger put in a thread of its own still continues `previous`'s
    conversation past its system prompt: the client edited an early message (the ledger's
    threads follow the edited history), rather than a new writer starting."""
    leading = 0
    while leading < len(current.units) and current.units[leading].role == "system":
        leading += 1
    first = cache_outcome.first_difference(current, previous)
    return first > leading


def _first_of_thread(
    current: Fingerprint,
    previous: Previous,
    now: float,
    rules: cache_outcome.CacheRules,
    client_marked: bool,
) -> Outcome:
    """A thread's first call, against the session's latest call in another thread: what it
    shares with it (the tools and system prompt, typically) may be read."""
    plain = cache_outcome.predict(
        current=current, previous=None, now=now, rules=rules, client_marked=client_marked
    )
    if plain.outcome == cache_outcome.NOT_CACHEABLE:
        return plain
    shared = cache_outcome.predict(current=current, previous=previous, now=now, rules=rules)
    read = (
        shared.predicted_read if shared.outcome in (cache_outcome.HIT, cache_outcome.PARTIAL) else 0
    )
    return Outcome(
        cache_outcome.PARTIAL if read > 0 else cache_outcome.MISS,
        cache_outcome.FIRST_CALL,
        shared_tokens=shared.shared_tokens if read > 0 else 0,
        predicted_read=read,
        prompt_tokens=plain.prompt_tokens,
        gap_seconds=shared.gap_seconds,
        ttl_seconds=shared.ttl_seconds,
        min_tokens=rules.min_tokens,
        previous_call=previous.call_id,
        previous_thread=previous.thread,
    )
