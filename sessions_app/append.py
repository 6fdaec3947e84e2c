"""The append engine: how `services.event_append`'s validated events are numbered, counted and
stored with the session's counters.

Three write paths, tried in order:

* direct (`_append_direct`): the counters' UPDATE ... RETURNING takes the session row's lock,
  moves the counters and hands back the row, then the events are inserted (SQLite);
* in one statement (`_append_in_one_statement`): the same UPDATE and INSERT as one statement,
  one round trip (PostgreSQL);
* careful (`_append_careful`): lock the row, look up the stored ids (an identical retry is
  returned as stored, another body is an `idempotency_conflict`), check the reported totals'
  bound, then update and insert.

The first two guess that every id is new; when they cannot decide alone (a stored id, the
reported totals' bound, no such session) nothing was written and they raise
`_TakeCarefulPath`, and the careful path decides. Either way `seq` is gap-free and the counters
on the session always equal the sums over its stored events, except the bill's: a call the
provider answered again (a retry whose reply the ledger already holds) is billed again
(`bill_again`), as the provider bills it. The statements themselves are in
`sessions_app.sql`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connection, transaction

from sessions_app import pricing, sql, tokens
from sessions_app.errors import Conflict, Unprocessable
from sessions_app.models import ROLE_FOR_TYPE, Event, EventType, Session, is_model_visible
from sessions_app.signals import announce_appended

# A session's running sum of each kind of provider-reported usage stays far below
# PostgreSQL's bigint.
MAX_REPORTED_TOTAL = 10**15


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    # Parts of prompt_tokens the provider read from its cache and wrote to it (of which at
    # the one-hour rate; kept for pricing, not stored as a column).
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None


@dataclass(frozen=True)
class EventInput:
    """A validated event as the API or the import command hands it to `event_append`."""

    type: str
    content: Any
    id: uuid.UUID | None = None
    name: str = ""
    tool_call_id: str = ""
    token_usage: TokenUsage | None = None
    pinned: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # The gateway's hash of the client message the event came from.
    message_hash: str = ""
    # On a gateway reply: what fitting kept from being sent on the call it answers (the
    # client's request minus what was forwarded, in tokens); see sessions_app.pricing.
    saved_tokens: int = 0
    # The event's cost as `tokens.messages_batch_tokens` gives it with the session's counter,
    # when the caller has already counted it (the gateway's window check): not counted again.
    token_count: int | None = None


@dataclass(frozen=True)
class AppendResult:
    events: list[Event]
    created: int
    # The session row as the append left it (counters included).
    session: Session | None = None


# An event as `event_append` validated it: the input, its content as stored, and whether that
# content is JSON.
Prepared = tuple[EventInput, str, bool]


# Above this many events a batch with ids (an import, a client's bulk retry) is more likely
# to hold stored ones, and counting them all up front would cost more than a look-up.
OPTIMISTIC_MAX_EVENTS = 64


def append_prepared(
    *,
    session: Session,
    prepared: list[Prepared],
    ids: set[uuid.UUID],
    session_updates: Mapping[str, Any],
    also: sql.RowUpdate | None = None,
) -> AppendResult:
    """Store the validated events (`ids`: the client-supplied ids among them) and move the
    session's counters, setting `session_updates` on its row in the same UPDATE, and apply
    `also` in the same transaction (whenever the append succeeds, a full replay included).
    See `services.event_append` for the contract."""
    counter = tokens.counter_for_model(session.model)
    counts: dict[int, int] = {
        index: entry[0].token_count
        for index, entry in enumerate(prepared)
        if entry[0].token_count is not None
    }

    def count(indexes: list[int]) -> None:
        missing = [i for i in indexes if i not in counts]
        costs = tokens.messages_batch_tokens(
            counter,
            [
                (ROLE_FOR_TYPE[prepared[i][0].type], prepared[i][0].content, prepared[i][0].name)
                for i in missing
            ],
        )
        counts.update(zip(missing, costs, strict=True))

    updates = dict(session_updates)
    if not ids or len(prepared) <= OPTIMISTIC_MAX_EVENTS:
        # The direct way: one UPDATE ... RETURNING takes the row lock, moves the counters and
        # hands back the row, then the events are inserted. Most ids a client sends are new
        # (a first attempt; the gateway's ids derived from the conversation), so they are
        # not looked up first: a stored id fails the insert, which rolls back, and the
        # careful way below decides. The only cost of guessing wrong is counting a retry's
        # tokens once.
        count(list(range(len(prepared))))
        try:
            return _append_direct(session, prepared, counts, updates, has_ids=bool(ids), also=also)
        except _TakeCarefulPath:
            pass

    # Stored events never change their body, so replays found now need no token count; ids
    # stored by a concurrent writer meanwhile are caught again under the lock below.
    replayed = _stored_replays(session, prepared, ids)
    count([index for index, entry in enumerate(prepared) if entry[0].id not in replayed])
    return _append_careful(session, prepared, counts, replayed, updates, ids, also)


@dataclass
class _Added:
    """What the new events add to the session's counters."""

    count: int = 0
    active: int = 0
    active_tokens: int = 0
    ledger: int = 0
    cumulative: int = 0
    prompt: int = 0
    completion: int = 0
    total: int = 0
    reported: int = 0
    # The bill: the session's model prices an event whose metadata names no other.
    model: str = ""
    cached: int = 0
    cache_write: int = 0
    cost_nano: int = 0
    saved: int = 0
    saved_nano: int = 0
    unpriced: int = 0
    unpriced_model: str = ""

    def add(self, item: EventInput, text: str, tokens_: int) -> None:
        self.count += 1
        self.ledger += tokens_
        if is_model_visible(item.type, text):
            self.active += 1
            self.active_tokens += tokens_
        # Synthetic turns (a refresh, a summary) do not count toward the next refresh.
        if item.type not in (EventType.CONTEXT_REFRESH, EventType.COMPACTION):
            self.cumulative += tokens_
        usage = item.token_usage
        if usage is not None:
            self.reported += 1
            self.prompt += usage.prompt_tokens or 0
            self.completion += usage.completion_tokens or 0
            self.total += usage.total_tokens or 0
            self._bill(item, usage)

    def _bill(self, item: EventInput, usage: TokenUsage) -> None:
        """Price the provider call this usage reports, and what fitting saved on it."""
        named = item.metadata.get("model")
        model = named if isinstance(named, str) and named else self.model
        self.cached += usage.cached_input_tokens or 0
        self.cache_write += usage.cache_write_tokens or 0
        price = pricing.price_call(
            model,
            pricing.CallUsage(
                input_tokens=usage.prompt_tokens or 0,
                output_tokens=usage.completion_tokens or 0,
                cached_input_tokens=usage.cached_input_tokens or 0,
                cache_write_tokens=usage.cache_write_tokens or 0,
                cache_write_1h_tokens=usage.cache_write_1h_tokens or 0,
            ),
        )
        saved = max(item.saved_tokens, 0)
        self.saved += saved
        if price.nano_usd is None:
            self.unpriced += 1
            self.unpriced_model = model[:200]
            return
        self.cost_nano += price.nano_usd
        if saved:
            self.saved_nano += pricing.price_input(model, saved).nano_usd or 0

    def deltas(self) -> dict[str, int]:
        return {
            "last_seq": self.count,
            "event_count": self.count,
            "active_event_count": self.active,
            "active_tokens": self.active_tokens,
            "ledger_tokens": self.ledger,
            "cumulative_tokens": self.cumulative,
            "reported_prompt_tokens": self.prompt,
            "reported_completion_tokens": self.completion,
            "reported_total_tokens": self.total,
            "reported_event_count": self.reported,
            "reported_cached_input_tokens": self.cached,
            "reported_cache_write_tokens": self.cache_write,
            "cost_nano_usd": self.cost_nano,
            "saved_tokens": self.saved,
            "saved_nano_usd": self.saved_nano,
            "unpriced_calls": self.unpriced,
        }

    def values(self) -> dict[str, Any]:
        """Plain values to set with the counters: the last model without a price."""
        return {"unpriced_model": self.unpriced_model} if self.unpriced else {}


def bill_again(
    *, session_id: uuid.UUID, model: str, usage: TokenUsage, saved_tokens: int = 0
) -> bool:
    """Add one more provider call's usage to the session's bill (tokens, cache, cost, savings)
    without storing an event: a retried call whose reply the ledger already held. The bill's
    bounds hold as for an append: past one, nothing is added (False)."""
    added = _Added(model=model)
    added.prompt = usage.prompt_tokens or 0
    added.completion = usage.completion_tokens or 0
    added.total = (
        usage.total_tokens if usage.total_tokens is not None else added.prompt + added.completion
    )
    added._bill(
        EventInput(type=EventType.AGENT_MESSAGE, content="", saved_tokens=saved_tokens), usage
    )
    deltas = {
        name: value
        for name, value in added.deltas().items()
        if name.startswith(("reported_", "cost_", "saved_", "unpriced_"))
        and name != "reported_event_count"
        and value
    }
    if not deltas:
        return True
    bounds = {
        name: bound - value
        for name, value, bound in (
            ("reported_prompt_tokens", added.prompt, MAX_REPORTED_TOTAL),
            ("reported_completion_tokens", added.completion, MAX_REPORTED_TOTAL),
            ("reported_total_tokens", added.total, MAX_REPORTED_TOTAL),
            ("cost_nano_usd", added.cost_nano, pricing.MAX_TOTAL_NANO_USD),
            ("saved_nano_usd", added.saved_nano, pricing.MAX_TOTAL_NANO_USD),
        )
        if value
    }
    if min(bounds.values(), default=0) < 0:
        return False
    row = sql.update_session_returning(
        session_id, deltas=deltas, values=added.values(), at_most=bounds
    )
    return row is not None


def _same_event(stored: Event, item: EventInput, text: str, is_json: bool) -> bool:
    """Whether a retry's body matches the stored event: type, content, name, toolCallId,
    tokenUsage and metadata. `pinned` is left out: it may have been changed since by PATCH."""
    usage = item.token_usage
    return (
        stored.type == item.type
        and stored.content == text
        and stored.content_is_json == is_json
        and stored.name == item.name
        and stored.tool_call_id == item.tool_call_id
        and stored.prompt_tokens == (usage.prompt_tokens if usage else None)
        and stored.completion_tokens == (usage.completion_tokens if usage else None)
        and stored.total_tokens == (usage.total_tokens if usage else None)
        and stored.cached_input_tokens == (usage.cached_input_tokens if usage else None)
        and stored.cache_write_tokens == (usage.cache_write_tokens if usage else None)
        # Through JSON text: Python's == would take true for 1 and 1.0 for 1.
        and _canonical_json(stored.metadata) == _canonical_json(item.metadata)
    )


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _idempotency_conflict() -> Conflict:
    # One wording whether the id is this session's with another body or someone else's:
    # the answer must not reveal that another user's event exists.
    return Conflict(
        "this event id is already used by a different event; resend the identical event or "
        "use a new id",
        code="idempotency_conflict",
        fields={"id": "already used by a different event"},
    )


def _stored_replays(
    session: Session,
    prepared: Sequence[Prepared],
    ids: set[uuid.UUID],
) -> dict[uuid.UUID, Event]:
    """The stored events these client-supplied ids name, each checked to be an identical
    retry (else `idempotency_conflict`)."""
    if not ids:
        return {}
    stored = {event.id: event for event in Event.objects.filter(id__in=ids)}
    if not stored:
        return stored
    for item, text, is_json in prepared:
        if item.id is None or item.id not in stored:
            continue
        event = stored[item.id]
        if event.session_id != session.pk or not _same_event(event, item, text, is_json):
            raise _idempotency_conflict()
    return stored


class _TakeCarefulPath(Exception):
    """The direct append could not decide alone (a stored id, the reported totals' bound, no
    such session): nothing was written, and the append is redone the careful way."""


def _store(
    row: Session,
    prepared: list[Prepared],
    counts: Mapping[int, int],
    existing: Mapping[uuid.UUID, Event],
) -> AppendResult:
    """Insert the events not in `existing`, their seqs ending at the row's new last_seq (the
    counters' UPDATE already moved it), and announce them once the transaction commits."""
    result, to_create = _new_events(prepared, counts, existing, session=row, last_seq=row.last_seq)
    sql.insert_events(to_create)
    return _stored(row, result, to_create)


def _new_events(
    prepared: list[Prepared],
    counts: Mapping[int, int],
    existing: Mapping[uuid.UUID, Event],
    *,
    session: Session,
    last_seq: int,
) -> tuple[list[Event], list[Event]]:
    """The append's events in request order (stored ones from `existing`), and the new ones,
    numbered so that the last ends at `last_seq`."""
    fresh = [
        index
        for index, (item, _, _) in enumerate(prepared)
        if item.id is None or item.id not in existing
    ]
    seq = last_seq - len(fresh)
    to_create: list[Event] = []
    result: list[Event] = []
    for index, (item, text, is_json) in enumerate(prepared):
        if item.id is not None and item.id in existing:
            result.append(existing[item.id])
            continue
        seq += 1
        usage = item.token_usage
        event = Event(
            id=item.id or uuid.uuid4(),
            session=session,
            seq=seq,
            type=item.type,
            content=text,
            content_is_json=is_json,
            name=item.name,
            tool_call_id=item.tool_call_id,
            token_count=counts[index],
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            total_tokens=usage.total_tokens if usage else None,
            cached_input_tokens=usage.cached_input_tokens if usage else None,
            cache_write_tokens=usage.cache_write_tokens if usage else None,
            pinned=item.pinned,
            metadata=dict(item.metadata),
            message_hash=item.message_hash,
        )
        to_create.append(event)
        result.append(event)
    return result, to_create


def _stored(row: Session, result: list[Event], created: list[Event]) -> AppendResult:
    """The append's result; its new events are announced once the transaction commits."""
    created_ids = [event.id for event in created]
    created_types = sorted({event.type for event in created})
    transaction.on_commit(
        lambda: announce_appended(
            sender=Session,
            session_id=row.pk,
            event_ids=created_ids,
            event_types=created_types,
            session=row,
        )
    )
    return AppendResult(events=result, created=len(created), session=row)


def _append_direct(
    session: Session,
    prepared: list[Prepared],
    counts: Mapping[int, int],
    updates: Mapping[str, Any],
    *,
    has_ids: bool,
    also: sql.RowUpdate | None = None,
) -> AppendResult:
    added = _Added(model=session.model)
    for index, (item, text, _) in enumerate(prepared):
        added.add(item, text, counts[index])
    updates = {**updates, **added.values()}
    # The reported totals' bound as a condition of the UPDATE: no row back means the bound,
    # or a missing session, and the careful way tells which.
    bounds = {
        name: bound - value
        for name, value, bound in (
            ("reported_prompt_tokens", added.prompt, MAX_REPORTED_TOTAL),
            ("reported_completion_tokens", added.completion, MAX_REPORTED_TOTAL),
            ("reported_total_tokens", added.total, MAX_REPORTED_TOTAL),
            ("cost_nano_usd", added.cost_nano, pricing.MAX_TOTAL_NANO_USD),
            ("saved_nano_usd", added.saved_nano, pricing.MAX_TOTAL_NANO_USD),
        )
        if value
    }
    if min(bounds.values(), default=0) < 0:
        raise _TakeCarefulPath  # past a bound on its own: the careful way says which
    if connection.vendor == "postgresql":
        return _append_in_one_statement(session, prepared, counts, added, updates, bounds, also)
    try:
        with transaction.atomic():
            row = sql.update_session_returning(
                session.pk, deltas=added.deltas(), values=updates, at_most=bounds
            )
            if row is None:
                raise _TakeCarefulPath
            if also is not None:
                sql.update_row(also)
            return _store(row, prepared, counts, {})
    except IntegrityError:
        if not has_ids:
            raise
        raise _TakeCarefulPath from None


def _append_in_one_statement(
    session: Session,
    prepared: list[Prepared],
    counts: Mapping[int, int],
    added: _Added,
    updates: Mapping[str, Any],
    bounds: Mapping[str, int],
    also: sql.RowUpdate | None = None,
) -> AppendResult:
    """The direct append on PostgreSQL: the counters' UPDATE and the events' INSERT as one
    statement (the INSERT numbers the events from the UPDATE's RETURNING), so outside a
    transaction it is one round trip and commits alone, where BEGIN, UPDATE, INSERT and
    COMMIT took four. A session row the UPDATE does not match (missing, or the reported
    totals' bound) leaves the events without a seq: the statement fails whole, as does one
    with a stored id, and the careful way decides."""
    # Numbered relative to the row's new last_seq, which only the statement knows: the last
    # event 0, the one before it -1, and so on.
    _, to_create = _new_events(prepared, counts, {}, session=session, last_seq=0)
    try:
        # A savepoint only inside a caller's transaction, which a failed statement would
        # otherwise abort.
        with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
            row = sql.append_in_one_statement(
                session.pk,
                deltas=added.deltas(),
                values=updates,
                at_most=bounds,
                events=to_create,
                also=also,
            )
    except IntegrityError:
        raise _TakeCarefulPath from None
    if row is None:
        raise _TakeCarefulPath
    for event in to_create:
        event.seq += row.last_seq
        event.session = row
    sql.mark_stored(to_create)
    return _stored(row, to_create, to_create)


def _append_careful(
    session: Session,
    prepared: list[Prepared],
    counts: Mapping[int, int],
    replayed: dict[uuid.UUID, Event],
    updates: Mapping[str, Any],
    seen: set[uuid.UUID],
    also: sql.RowUpdate | None = None,
) -> AppendResult:
    try:
        with transaction.atomic():
            locked = Session.objects.select_for_update().get(pk=session.pk)
            existing = dict(replayed)
            fresh = [entry for entry in prepared if entry[0].id not in replayed]
            existing.update(_stored_replays(locked, fresh, seen - set(replayed)))
            added = _Added(model=locked.model)
            for index, (item, text, _) in enumerate(prepared):
                if item.id is None or item.id not in existing:
                    added.add(item, text, counts[index])
            if not added.count:
                if also is not None:
                    sql.update_row(also)
                return AppendResult(
                    events=[existing[item.id] for item, _, _ in prepared if item.id is not None],
                    created=0,
                    session=locked,
                )
            _check_reported_totals(
                locked, prompt=added.prompt, completion=added.completion, total=added.total
            )
            _check_bill_totals(locked, added)
            row = sql.update_session_returning(
                session.pk, deltas=added.deltas(), values={**updates, **added.values()}
            )
            assert row is not None  # locked above
            if also is not None:
                sql.update_row(also)
            return _store(row, prepared, counts, existing)
    except IntegrityError:
        if not seen:
            raise
        # Another session's append stored one of these ids after our check above (its lock
        # is not ours): the same conflict, found late.
        raise _idempotency_conflict() from None


def _check_reported_totals(session: Session, *, prompt: int, completion: int, total: int) -> None:
    for key, current, added in (
        ("totalPromptTokens", session.reported_prompt_tokens, prompt),
        ("totalCompletionTokens", session.reported_completion_tokens, completion),
        ("totalTokens", session.reported_total_tokens, total),
    ):
        if current + added > MAX_REPORTED_TOTAL:
            raise Unprocessable(
                f"this append would take the session's {key} past {MAX_REPORTED_TOTAL}",
                code="token_usage_total_exceeded",
                limit=MAX_REPORTED_TOTAL,
            )


def _check_bill_totals(session: Session, added: _Added) -> None:
    """The session's cost and savings stay within what a bigint holds (nanodollars)."""
    for key, current, more in (
        ("costUsd", session.cost_nano_usd, added.cost_nano),
        ("savedUsd", session.saved_nano_usd, added.saved_nano),
    ):
        if current + more > pricing.MAX_TOTAL_NANO_USD:
            raise Unprocessable(
                f"this append would take the session's {key} past "
                f"{pricing.MAX_TOTAL_NANO_USD // pricing.NANO_PER_USD} USD",
                code="token_usage_total_exceeded",
                limit=pricing.MAX_TOTAL_NANO_USD // pricing.NANO_PER_USD,
            )
