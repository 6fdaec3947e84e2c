"""A call's story, read from the ledger (selectors; nothing here writes).

The request as the client sent it is rebuilt from the call's `request_map` and the calls
before it: each request continues a message the ledger holds (usually the previous call's
reply) and adds its own new messages, so its messages are the continued history plus its own
seqs, walked back call by call. Nothing of a body is stored twice.

What fitting did to each message is read from the ledger as it stood when the call was
forwarded: a message folded by a COMPACTION event stored by then went out as that summary (the
summary live at that moment: a later run folding the summary into its own does not count); a
tool result cleared by then went out as its placeholder; a per-call prune is the call's own
note. A run reverted since no longer marks what it folded; the story says so.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q

from sessions_app import context_window, pricing
from sessions_app.calls import call_document, with_reply_seq
from sessions_app.errors import NotFound
from sessions_app.models import ROLE_FOR_TYPE, Call, Event, EventType, Session

# Characters of each message's content the story carries (the event itself has the rest).
CONTENT_CHARS = 2000
SUMMARY_CHARS = 8000
# Calls of a session read at most to rebuild one request (each is a few small fields).
MAX_CALLS = 50_000

KEPT = "kept"
SUMMARIZED = "summarized"
CLEARED = "cleared"
PRUNED = "pruned"


def call_get(*, user: AbstractBaseUser | AnonymousUser, call_id: Any) -> Call:
    """The call `call_id` if the user may see its session (staff: any); NotFound otherwise,
    the same answer as for a call that does not exist."""
    try:
        pk = uuid.UUID(str(call_id))
    except ValueError:
        raise NotFound("call not found", code="not_found") from None
    queryset = Call.objects.filter(pk=pk)
    if not getattr(user, "is_staff", False):
        queryset = queryset.filter(owner_id=user.pk)
    call = with_reply_seq(queryset).select_related("session", "owner").first()
    if call is None:
        raise NotFound("call not found", code="not_found")
    return call


def _session_of(call: Call) -> uuid.UUID:
    """The call's session (the story's readers run only for a call that has one)."""
    if call.session_id is None:
        raise NotFound("call not found", code="not_found")
    return call.session_id


def forwarded_at(call: Call) -> datetime.datetime:
    """When fitting had decided what to send: the first send upstream (for a call never
    forwarded, its end). A millisecond of slack: the stored offsets are whole milliseconds."""
    offset = call.gateway_ms if call.gateway_ms is not None else call.total_ms
    return call.started_at + datetime.timedelta(milliseconds=(offset or 0) + 1)


def _runs(runs: Iterable[Sequence[int]]) -> list[int]:
    seqs: list[int] = []
    for run in runs:
        if len(run) == 2 and run[0] <= run[1] and run[1] - run[0] < 1_000_000:
            seqs.extend(range(int(run[0]), int(run[1]) + 1))
    return seqs


@dataclass
class _Rebuilt:
    seqs: list[int] = field(default_factory=list)
    # Messages at the start the ledger does not place (recorded before calls kept a map, or
    # through the REST API).
    unmapped: int = 0
    known: bool = True


def _rebuild(call: Call) -> _Rebuilt:
    """The seqs of the events the call's request held, in order."""
    own_map = call.request_map or {}
    if not own_map:
        return _Rebuilt(known=False)
    calls = list(
        Call.objects.filter(session_id=_session_of(call), started_at__lte=call.started_at)
        .order_by("-started_at")
        .values_list("id", "reply_event_id", "request_map")[:MAX_CALLS]
    )
    by_reply = {reply: (pk, data or {}) for pk, reply, data in calls if reply is not None}
    by_seq: dict[int, tuple[Any, dict[str, Any]]] = {}
    for pk, _reply, data in reversed(calls):
        for seq in _runs((data or {}).get("seqs") or ()):
            by_seq.setdefault(seq, (pk, data or {}))
    segments: list[list[int]] = []
    current = own_map
    own = _runs(current.get("seqs") or ())
    segments.append(own)
    seen: set[Any] = {call.pk}
    after = current.get("after")
    while after:
        try:
            event = (
                Event.objects.filter(session_id=_session_of(call), pk=uuid.UUID(str(after)))
                .only("seq", "message_hash")
                .first()
            )
        except ValueError:
            event = None
        if event is None:
            break
        found = by_reply.get(event.pk)
        if found is not None:
            pk, data = found
            parts = int(data.get("replyParts") or 1)
            # That call's request, then its reply (segments are gathered newest first).
            segments.append(list(range(event.seq, event.seq + parts)))
            segments.append(_runs(data.get("seqs") or ()))
        else:
            found = by_seq.get(event.seq)
            if found is None:
                break
            pk, data = found
            theirs = _runs(data.get("seqs") or ())
            upto = [s for s in theirs if s <= event.seq]
            # The message's other parts (same message, consecutive events) go with it.
            rest = [s for s in theirs if s > event.seq]
            if rest:
                hashes = dict(
                    Event.objects.filter(session_id=_session_of(call), seq__in=rest).values_list(
                        "seq", "message_hash"
                    )
                )
                for seq in rest:
                    if hashes.get(seq) != event.message_hash or not event.message_hash:
                        break
                    upto.append(seq)
            segments.append(upto)
        if pk in seen:
            break
        seen.add(pk)
        after = data.get("after")
    seqs = [seq for segment in reversed(segments) for seq in segment]
    expected = int(own_map.get("messages") or 0)
    return _Rebuilt(seqs=seqs, unmapped=0 if not after else max(expected - len(seqs), 0))


def _content(event: Event) -> tuple[str, bool]:
    text = event.content or ""
    return text[:CONTENT_CHARS], len(text) > CONTENT_CHARS


@dataclass(frozen=True)
class _Marker:
    pk: Any
    seq: int
    created_at: datetime.datetime
    parent: Any
    reverted: bool
    content: str


def _markers(session_id: Any) -> dict[Any, _Marker]:
    return {
        pk: _Marker(pk, seq, created_at, parent, reverted, content)
        for pk, seq, created_at, parent, reverted, content in Event.objects.filter(
            session_id=session_id, type=EventType.COMPACTION
        ).values_list("pk", "seq", "created_at", "compacted_by_id", "reverted", "content")
    }


def _live_at(marker: _Marker | None, markers: dict[Any, _Marker], moment: datetime.datetime):
    """The summary that stood for a message folded into `marker` at `moment`: the marker, or
    the later marker that had folded it by then (a run folding the earlier summary)."""
    if marker is None or marker.created_at > moment:
        return None
    seen = {marker.pk}
    while marker.parent is not None:
        parent = markers.get(marker.parent)
        if parent is None or parent.created_at > moment or parent.pk in seen:
            break
        seen.add(parent.pk)
        marker = parent
    return marker


def _pruned_indices(fit: dict[str, Any]) -> set[int]:
    return set(_runs(fit.get("pruned") or ()))


def request_messages(call: Call) -> dict[str, Any]:
    """The request as sent and as forwarded: each event with its fate at the call's moment,
    and the summaries the forwarded request carried."""
    rebuilt = _rebuild(call)
    if not rebuilt.known:
        return {"known": False, "messages": [], "summaries": [], "unmapped": 0, "notes": []}
    moment = forwarded_at(call)
    events = {
        event.seq: event
        for event in Event.objects.filter(session_id=_session_of(call), seq__in=rebuilt.seqs).only(
            "id",
            "seq",
            "type",
            "content",
            "name",
            "tool_call_id",
            "token_count",
            "cleared_content",
            "cleared_token_count",
            "cleared_by_id",
            "compacted_by_id",
            "message_hash",
            "metadata",
            "created_at",
        )
    }
    markers = _markers(call.session_id)
    pruned = _pruned_indices(call.fit or {})
    rows: list[dict[str, Any]] = []
    used: dict[Any, _Marker] = {}
    for index, seq in enumerate(rebuilt.seqs):
        event = events.get(seq)
        if event is None:
            continue
        content, truncated = _content(event)
        row: dict[str, Any] = {
            "index": index + rebuilt.unmapped,
            "seq": event.seq,
            "id": str(event.pk),
            "type": event.type,
            "role": ROLE_FOR_TYPE.get(event.type, ""),
            "name": event.name,
            "toolCallId": event.tool_call_id,
            "thread": str((event.metadata or {}).get("thread") or ""),
            "tokenCount": event.token_count,
            "content": content,
            "truncated": truncated,
            "fate": KEPT,
            "forwardedTokens": event.token_count,
        }
        live = _live_at(markers.get(event.compacted_by_id), markers, moment)
        cleared = markers.get(event.cleared_by_id)
        if live is not None:
            row.update(fate=SUMMARIZED, summarySeq=live.seq, forwardedTokens=0)
            used[live.pk] = live
        elif index in pruned:
            row.update(fate=PRUNED, forwardedTokens=0)
        elif (
            cleared is not None
            and cleared.created_at <= moment
            and event.cleared_content is not None
        ):
            row.update(
                fate=CLEARED,
                placeholder=event.cleared_content,
                forwardedTokens=event.cleared_token_count,
            )
        rows.append(row)
    _whole_messages(rows, events)
    notes = []
    # Runs stored by then and reverted (before or since): compaction_app says which were
    # reverted after the call (their folds were in effect for it and no longer show).
    reverted = [str(m.pk) for m in markers.values() if m.reverted and m.created_at <= moment]
    if rebuilt.unmapped:
        notes.append(
            f"The first {rebuilt.unmapped} message(s) were recorded outside the gateway's "
            "calls (the REST API, or calls older than the call map); they are not listed."
        )
    summaries = [
        {
            "seq": marker.seq,
            "id": str(marker.pk),
            "content": marker.content[:SUMMARY_CHARS],
            "truncated": len(marker.content) > SUMMARY_CHARS,
        }
        for marker in sorted(used.values(), key=lambda m: m.seq)
    ]
    return {
        "known": True,
        "messages": rows,
        "summaries": summaries,
        "unmapped": rebuilt.unmapped,
        "notes": notes,
        "markers": sorted(
            {str(pk) for pk in used}
            | {
                str(events[row["seq"]].cleared_by_id)
                for row in rows
                if row["fate"] == CLEARED and events[row["seq"]].cleared_by_id
            }
        ),
        "revertedMarkers": reverted,
    }


def _whole_messages(rows: list[dict[str, Any]], events: dict[int, Event]) -> None:
    """A message goes out whole while any part of it stands (the words beside a tool call
    stay with the call kept): a part shown folded beside a kept part is kept."""
    groups: list[list[dict[str, Any]]] = []
    for row in rows:
        digest = events[row["seq"]].message_hash
        if (
            groups
            and digest
            and events[groups[-1][-1]["seq"]].message_hash == digest
            and groups[-1][-1]["seq"] + 1 == row["seq"]
        ):
            groups[-1].append(row)
        else:
            groups.append([row])
    for group in groups:
        if len(group) > 1 and any(r["fate"] in (KEPT, CLEARED) for r in group):
            for row in group:
                if row["fate"] == SUMMARIZED:
                    row.update(fate=KEPT, forwardedTokens=row["tokenCount"])
                    row.pop("summarySeq", None)


def reply_events(call: Call) -> list[dict[str, Any]]:
    if call.reply_event_id is None:
        return []
    first = Event.objects.filter(session_id=_session_of(call), pk=call.reply_event_id).first()
    if first is None:
        return []
    parts = int((call.request_map or {}).get("replyParts") or 1)
    rows = []
    for event in Event.objects.filter(
        session_id=_session_of(call), seq__gte=first.seq, seq__lt=first.seq + parts
    ).order_by("seq"):
        content, truncated = _content(event)
        rows.append(
            {
                "seq": event.seq,
                "id": str(event.pk),
                "type": event.type,
                "role": ROLE_FOR_TYPE.get(event.type, ""),
                "name": event.name,
                "toolCallId": event.tool_call_id,
                "tokenCount": event.token_count,
                "content": content,
                "truncated": truncated,
                "incomplete": bool((event.metadata or {}).get("incomplete")),
            }
        )
    return rows


def cost_by_kind(call: Call) -> dict[str, Any]:
    """The call's tokens and price by kind: uncached input, cache reads, cache writes and
    output, each at the model's own rate (the total is the call's billed cost)."""
    model = call.model_served or call.model_requested
    prompt = call.prompt_tokens or 0
    read = min(call.cached_input_tokens or 0, prompt)
    write = min(call.cache_write_tokens or 0, prompt - read)
    uncached = prompt - read - write
    output = call.completion_tokens or 0
    reported = call.prompt_tokens is not None or call.completion_tokens is not None

    def price(usage: pricing.CallUsage) -> float | None:
        if not reported:
            return None
        found = pricing.price_call(model, usage)
        return pricing.usd(found.nano_usd) if found.nano_usd is not None else None

    return {
        "reported": reported,
        "tokens": {
            "input": uncached if reported else None,
            "cacheRead": read if reported else None,
            "cacheWrite": write if reported else None,
            "output": output if reported else None,
        },
        "costUsd": {
            "input": price(pricing.CallUsage(input_tokens=uncached)),
            "cacheRead": price(pricing.CallUsage(input_tokens=read, cached_input_tokens=read)),
            "cacheWrite": price(pricing.CallUsage(input_tokens=write, cache_write_tokens=write)),
            "output": price(pricing.CallUsage(output_tokens=output)),
            "total": pricing.usd(call.cost_nano_usd) if call.cost_nano_usd is not None else None,
        },
        "cacheHitRate": pricing.hit_rate(cached=read, input_tokens=prompt) if reported else None,
    }


def latency_split(call: Call) -> dict[str, int | None]:
    """Where the call's time went: the gateway before forwarding, the provider to its first
    byte, the rest of the answer, and the whole."""
    gateway = call.gateway_ms
    provider = (
        max(call.ttfb_ms - gateway, 0) if call.ttfb_ms is not None and gateway is not None else None
    )
    after = (
        max(call.total_ms - call.ttfb_ms, 0)
        if call.total_ms is not None and call.ttfb_ms is not None
        else None
    )
    return {
        "gatewayMs": gateway,
        "providerFirstByteMs": provider,
        "afterFirstByteMs": after,
        "ttfbMs": call.ttfb_ms,
        "totalMs": call.total_ms,
    }


def _neighbour(queryset: Any, call: Call, *, newer: bool) -> str | None:
    if newer:
        found = (
            queryset.filter(
                Q(started_at__gt=call.started_at) | Q(started_at=call.started_at, id__gt=call.pk)
            )
            .order_by("started_at", "id")
            .values_list("id", flat=True)
            .first()
        )
    else:
        found = (
            queryset.filter(
                Q(started_at__lt=call.started_at) | Q(started_at=call.started_at, id__lt=call.pk)
            )
            .order_by("-started_at", "-id")
            .values_list("id", flat=True)
            .first()
        )
    return str(found) if found is not None else None


def neighbours(call: Call) -> dict[str, str | None]:
    session_calls = Call.objects.filter(session_id=_session_of(call))
    thread_calls = session_calls.filter(thread=call.thread)
    return {
        "previous": _neighbour(session_calls, call, newer=False),
        "next": _neighbour(session_calls, call, newer=True),
        "previousInThread": _neighbour(thread_calls, call, newer=False),
        "nextInThread": _neighbour(thread_calls, call, newer=True),
    }


def context_figures(call: Call, session: Session) -> dict[str, Any]:
    """The context as the client sent it (our count) and as forwarded, against the window
    the call was fitted to."""
    fit = call.fit or {}
    limit = fit.get("limit") or session.context_limit
    after = call.forwarded_tokens
    before = after + call.saved_tokens if after is not None else None

    def percent(tokens: int | None) -> float | None:
        if tokens is None or not limit:
            return None
        # The one window computation (thresholds play no part in a percentage).
        return context_window.window_level(
            tokens=tokens, window=limit, compact_threshold=1.0, hard_threshold=1.0
        ).percent_used

    return {
        "limit": limit,
        "sentTokens": before,
        "forwardedTokens": after,
        "sentPercent": percent(before),
        "forwardedPercent": percent(after),
        "how": fit.get("how") or "",
    }


def call_story(*, call: Call) -> dict[str, Any]:
    """Everything the call page and `GET /calls/{id}` show of one call. A call refused before
    its session existed has only its own row: no ledger to rebuild its request from."""
    session = call.session
    if session is None:
        return {
            **call_document(call),
            "sessionTitle": "",
            "gatewayMs": call.gateway_ms,
            "latency": latency_split(call),
            "usage": cost_by_kind(call),
            "headers": call.headers or {"request": {}, "response": {}},
            "fit": call.fit or {},
            "context": None,
            "request": {
                "known": False,
                "messages": [],
                "summaries": [],
                "unmapped": 0,
                "notes": [],
            },
            "reply": [],
            "neighbours": {"previous": None, "next": None},
            "forwardedAt": forwarded_at(call).isoformat().replace("+00:00", "Z"),
            "_markers": [],
            "_revertedMarkers": [],
        }
    request = request_messages(call)
    return {
        **call_document(call),
        "sessionTitle": str(session),
        "gatewayMs": call.gateway_ms,
        "latency": latency_split(call),
        "usage": cost_by_kind(call),
        "headers": call.headers or {"request": {}, "response": {}},
        "fit": call.fit or {},
        "context": context_figures(call, session),
        "request": {k: v for k, v in request.items() if k not in ("markers", "revertedMarkers")},
        "reply": reply_events(call),
        "neighbours": neighbours(call),
        "forwardedAt": forwarded_at(call).isoformat().replace("+00:00", "Z"),
        "_markers": request.get("markers", []),
        "_revertedMarkers": request.get("revertedMarkers", []),
    }
