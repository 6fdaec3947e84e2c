"""Full-text search and recall over every event of a session, folded ones included.

The index itself is described in `sessions_app/search_schema.py`. Here: turning what a user
typed into a safe query, ranking, HTML-safe snippets, and recall (original events rendered as
messages within a token budget).

A query is never passed to the search engine as typed. It is split into words on whitespace;
each word keeps only its letters and digits (the same split the index made) and becomes a
phrase, so `ERR_RATE_LIMITED` is the phrase `err rate limited` and `"`, `*`, `-`, `NEAR`,
`AND`, `:` and parentheses are plain text, never operators. Every word must match (AND); the
last word also matches as a prefix, so results appear while a word is being typed.
"""

from __future__ import annotations

import copy
import html
import logging
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DatabaseError, connection, transaction
from django.db.models import Q

from sessions_app.errors import InvalidInput
from sessions_app.models import Event, EventType, Session, is_model_visible
from sessions_app.search_schema import (
    DOCUMENT_FUNCTION,
    FTS_TABLE,
    MAP_TABLE,
    STATE_TABLE,
    VECTOR_COLUMN,
)
from sessions_app.selectors import render_messages

logger = logging.getLogger("sessions_app.search")

MAX_QUERY_CHARS = 500
MAX_WORDS = 32
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
SNIPPET_CHARS = 240
# A prefix of one character would expand to most of the vocabulary.
MIN_PREFIX_CHARS = 2

RECALL_TOOL_NAME = "ledger_recall"
RECALL_DEFAULT_TOKENS = 4000
RECALL_MAX_SEQS = 200
# Recall by query considers this many of the best-ranked hits.
RECALL_CANDIDATES = 50

_TOKEN = re.compile(r"[^\W_]+")
_SPACE = re.compile(r"\s+")
_EVENT_TABLE = Event._meta.db_table
_SESSION_TABLE = Session._meta.db_table


# --- queries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedQuery:
    """What a user typed, as phrases of index tokens (lower case, letters and digits only)."""

    words: tuple[tuple[str, ...], ...]
    prefix: bool

    def fts5(self) -> str:
        """An FTS5 MATCH expression; tokens are letters and digits only, so quoting them is
        enough to make every one a plain term."""
        phrases = [f'"{" ".join(word)}"' for word in self.words]
        if self.prefix:
            phrases[-1] += "*"
        return " ".join(phrases)

    def tsquery(self) -> str:
        """A `to_tsquery` text: words AND-ed, each word's tokens adjacent (`<->`)."""
        parts = []
        for index, word in enumerate(self.words):
            tokens = list(word)
            if self.prefix and index == len(self.words) - 1:
                tokens[-1] += ":*"
            parts.append("(" + " <-> ".join(tokens) + ")")
        return " & ".join(parts)

    def pattern(self) -> re.Pattern[str]:
        """A regex finding the words in the original text, for snippets."""
        alternatives = []
        for index, word in enumerate(self.words):
            body = r"[\W_]+".join(re.escape(token) for token in word)
            last = self.prefix and index == len(self.words) - 1
            # A prefix highlights the whole word it starts.
            alternatives.append(rf"(?<![^\W_]){body}" + (r"[^\W_]*" if last else r"(?![^\W_])"))
        return re.compile("|".join(alternatives), re.IGNORECASE)


def parse_query(text: str) -> ParsedQuery | None:
    """The query for `text`, or None when it holds no letter or digit at all."""
    words: list[tuple[str, ...]] = []
    for raw in text.split():
        word = tuple(token.lower() for token in _TOKEN.findall(raw))
        if word and word not in words:
            words.append(word)
    if not words:
        return None
    words = words[:MAX_WORDS]
    return ParsedQuery(words=tuple(words), prefix=len(words[-1][-1]) >= MIN_PREFIX_CHARS)


def check_query(text: Any) -> str:
    """The `q` parameter, validated: a non-empty string of at most MAX_QUERY_CHARS."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput("q must not be empty", code="invalid_query", fields={"q": "required"})
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidInput(
            f"q must be at most {MAX_QUERY_CHARS} characters",
            code="invalid_query",
            fields={"q": f"at most {MAX_QUERY_CHARS} characters"},
        )
    return text


# --- ranking ---------------------------------------------------------------------------------


# The columns a hit needs (one query: ranking, event and session title together).
_HIT_COLUMNS = (
    "e.id, e.session_id, e.seq, e.type, e.name, e.content, e.compacted_by_id, "
    "s.title AS session_title"
)


def _ranked_events(
    query: ParsedQuery,
    *,
    session_id: uuid.UUID | None,
    owner_id: Any | None,
    limit: int,
) -> list[Event]:
    """Events matching `query`, best first (ties: newest first), with only the hit columns
    loaded and `session_title` set. Scope: one session, or the sessions of `owner_id`, or
    (both None) everything."""
    params: list[Any] | dict[str, Any]
    if connection.vendor == "sqlite":
        sql, params = _sqlite_sql(query, session_id=session_id, owner_id=owner_id, limit=limit)
    elif connection.vendor == "postgresql":
        sql, params = _postgres_sql(query, session_id=session_id, owner_id=owner_id, limit=limit)
    else:  # pragma: no cover - the two supported profiles
        raise NotImplementedError(connection.vendor)
    try:
        return list(Event.objects.raw(sql, params))
    except DatabaseError as exc:
        # The expression is built from letters and digits only; if an engine still refuses
        # it, that is a query we cannot run, not a server failure.
        logger.warning("search query %r failed: %s", query, exc)
        raise InvalidInput("this query cannot be searched", code="invalid_query") from None


def _sqlite_sql(
    query: ParsedQuery, *, session_id: uuid.UUID | None, owner_id: Any | None, limit: int
) -> tuple[str, list[Any]]:
    match = "{body} : (" + query.fts5() + ")"
    scope = ""
    params: list[Any] = []
    if session_id is not None:
        # The session id is an indexed column of the FTS table: FTS5 intersects it with the
        # terms itself instead of ranking every user's matches first.
        match = '{sid} : "' + session_id.hex + '" AND ' + match
    elif owner_id is not None:
        scope = "AND s.owner_id = %s"
        params.append(owner_id)
    # Identifiers come from constants; the MATCH expression and values are parameters.
    sql = (
        f"SELECT {_HIT_COLUMNS} FROM {FTS_TABLE} f "  # noqa: S608
        f"JOIN {MAP_TABLE} m ON m.id = f.rowid "
        f"JOIN {_EVENT_TABLE} e ON e.id = m.event_id "
        f"JOIN {_SESSION_TABLE} s ON s.id = e.session_id "
        f"WHERE {FTS_TABLE} MATCH %s {scope} "
        f"ORDER BY bm25({FTS_TABLE}, 0.0, 1.0), e.seq DESC LIMIT %s"
    )
    return sql, [match, *params, limit]


def _postgres_sql(
    query: ParsedQuery, *, session_id: uuid.UUID | None, owner_id: Any | None, limit: int
) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"q": query.tsquery(), "limit": limit}
    if session_id is not None:
        scope = "session_id = %(session)s"
        params["session"] = session_id
    elif owner_id is not None:
        scope = f"session_id IN (SELECT id FROM {_SESSION_TABLE} WHERE owner_id = %(owner)s)"  # noqa: S608
        params["owner"] = owner_id
    else:
        scope = "TRUE"
    # Indexed rows through the GIN index; rows whose vector the background task has not
    # written yet (a partial index finds them) get it computed here, so nothing is missed.
    sql = (
        "WITH query AS (SELECT to_tsquery('simple'::regconfig, %(q)s) AS q) "  # noqa: S608
        f"SELECT {_HIT_COLUMNS} FROM ("
        "  SELECT ranked.id, ranked.seq, ranked.rank FROM ("
        f"    SELECT id, seq, ts_rank_cd({VECTOR_COLUMN}, query.q, 1) AS rank "
        f"    FROM {_EVENT_TABLE}, query WHERE {scope} AND {VECTOR_COLUMN} @@ query.q "
        "    UNION ALL "
        "    SELECT p.id, p.seq, ts_rank_cd(p.document, query.q, 1) FROM ("
        f"      SELECT id, seq, {DOCUMENT_FUNCTION}(content, name) AS document "
        f"      FROM {_EVENT_TABLE} WHERE {scope} AND {VECTOR_COLUMN} IS NULL"
        "    ) p, query WHERE p.document @@ query.q"
        "  ) ranked ORDER BY ranked.rank DESC, ranked.seq DESC LIMIT %(limit)s"
        f") hits JOIN {_EVENT_TABLE} e ON e.id = hits.id "
        f"JOIN {_SESSION_TABLE} s ON s.id = e.session_id "
        "ORDER BY hits.rank DESC, hits.seq DESC"
    )
    return sql, params


# --- snippets --------------------------------------------------------------------------------


def snippet(text: str, pattern: re.Pattern[str], *, width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `text` around its first match, HTML-escaped, with every
    match inside wrapped in `<mark>`; whitespace runs become one space, and `…` marks a cut."""
    first = pattern.search(text)
    start = 0
    if first is not None and first.start() > width // 3:
        start = first.start() - width // 3
        space = text.find(" ", start, first.start())
        start = space + 1 if space != -1 else start
    # Cut wide enough that collapsing whitespace still leaves `width` characters.
    window = _SPACE.sub(" ", text[start : start + width * 4]).strip()
    cut_end = start + width * 4 < len(text) or len(window) > width
    window = window[:width]
    parts: list[str] = []
    position = 0
    for found in pattern.finditer(window):
        if found.end() == found.start():
            continue
        parts.append(html.escape(window[position : found.start()]))
        parts.append("<mark>" + html.escape(found.group()) + "</mark>")
        position = found.end()
    parts.append(html.escape(window[position:]))
    return ("…" if start > 0 else "") + "".join(parts) + ("…" if cut_end else "")


# --- search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchHit:
    event: Event
    snippet: str

    @property
    def folded(self) -> bool:
        return self.event.compacted_by_id is not None

    @property
    def session_title(self) -> str:
        return str(getattr(self.event, "session_title", ""))


def _hits(events: list[Event], query: ParsedQuery) -> list[SearchHit]:
    pattern = query.pattern()
    return [SearchHit(event=event, snippet=snippet(event.content, pattern)) for event in events]


def search_session(*, session: Session, text: str, limit: int = DEFAULT_LIMIT) -> list[SearchHit]:
    """Events of `session` (folded, cleared and invisible ones included) matching `text`,
    best first."""
    query = parse_query(text)
    if query is None:
        return []
    _index_scope(session_id=session.pk)
    return _hits(_ranked_events(query, session_id=session.pk, owner_id=None, limit=limit), query)


def search_sessions(
    *, user: AbstractBaseUser | AnonymousUser, text: str, limit: int = DEFAULT_LIMIT
) -> list[SearchHit]:
    """Events matching `text` across the sessions `user` may see (staff: all), best first."""
    query = parse_query(text)
    if query is None:
        return []
    owner = None if getattr(user, "is_staff", False) else user.pk
    _index_scope(owner_id=owner)
    return _hits(_ranked_events(query, session_id=None, owner_id=owner, limit=limit), query)


def sessions_matching_content(*, text: str) -> Q | None:
    """A filter on Session for sessions holding an event that matches `text` (for the
    dashboard's list search), or None when `text` has nothing searchable."""
    query = parse_query(text)
    if query is None:
        return None
    _index_scope()
    if connection.vendor == "sqlite":
        sql = (
            f"SELECT e.session_id FROM {FTS_TABLE} f "  # noqa: S608
            f"JOIN {MAP_TABLE} m ON m.id = f.rowid JOIN {_EVENT_TABLE} e ON e.id = m.event_id "
            f"WHERE {FTS_TABLE} MATCH %s"
        )
        params: list[Any] = ["{body} : (" + query.fts5() + ")"]
    else:
        sql = (
            f"SELECT session_id FROM {_EVENT_TABLE} "  # noqa: S608
            f"WHERE {VECTOR_COLUMN} @@ to_tsquery('simple'::regconfig, %s) "
            f"OR ({VECTOR_COLUMN} IS NULL "
            f"AND {DOCUMENT_FUNCTION}(content, name) @@ to_tsquery('simple'::regconfig, %s))"
        )
        params = [query.tsquery(), query.tsquery()]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = {row[0] if isinstance(row[0], uuid.UUID) else uuid.UUID(row[0]) for row in cursor}
    return Q(pk__in=ids)


def search_index_pending(*, session_id: Any, batch: int = 500) -> int:
    """Index the session's events the search index lacks; returns how many were indexed.
    Idempotent (the Celery task after an append and a search may both call it).

    SQLite: the events above the session's indexed seq, in one IMMEDIATE transaction (the
    write lock is taken at BEGIN, so two callers never index the same events). PostgreSQL:
    rows without a vector, in batches; rows another transaction holds are skipped and left to
    the next call (search computes their vector meanwhile)."""
    key = uuid.UUID(str(session_id))
    if connection.vendor == "sqlite":
        return _sqlite_index(key)
    if connection.vendor != "postgresql":
        return 0
    return _pg_index("session_id = %s AND", [key], batch=batch, order="ORDER BY seq")


def _pg_index(scope: str, params: list[Any], *, batch: int, order: str = "") -> int:
    """Write the vectors of unindexed rows in `scope` (a WHERE prefix), `batch` rows per
    statement, until none is left; rows another transaction holds are skipped and left to the
    next call (search computes their vector meanwhile). The partial index on unindexed rows
    finds them."""
    sql = (
        f"UPDATE {_EVENT_TABLE} SET {VECTOR_COLUMN} = {DOCUMENT_FUNCTION}(content, name) "  # noqa: S608
        f"WHERE id IN (SELECT id FROM {_EVENT_TABLE} WHERE {scope} "
        f"{VECTOR_COLUMN} IS NULL {order} LIMIT %s FOR UPDATE SKIP LOCKED)"
    )
    done = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, batch])
            count = cursor.rowcount
        done += count
        if count < batch:
            return done


def _sqlite_index(session_id: uuid.UUID) -> int:
    sid = session_id.hex
    # Identifiers come from constants; values are parameters.
    watermark = (
        f"SELECT coalesce((SELECT indexed_seq FROM {STATE_TABLE} WHERE session_id = %s), 0), "  # noqa: S608
        f"coalesce((SELECT last_seq FROM {_SESSION_TABLE} WHERE id = %s), 0), "
        f"(SELECT coalesce(max(id), 0) FROM {MAP_TABLE})"
    )
    with connection.cursor() as cursor:
        # A plain read first: the usual answer is "nothing to do", and it must not queue
        # every search behind the database's single write lock.
        cursor.execute(watermark, [sid, sid])
        indexed, last, _top = cursor.fetchone()
    if last <= indexed:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(watermark, [sid, sid])  # again, under the write lock
        indexed, last, top = cursor.fetchone()
        if last <= indexed:
            return 0
        cursor.execute(
            f"INSERT INTO {MAP_TABLE} (event_id) SELECT id FROM {_EVENT_TABLE} "  # noqa: S608
            "WHERE session_id = %s AND seq > %s ORDER BY seq",
            [sid, indexed],
        )
        count = cursor.rowcount
        cursor.execute(
            f"INSERT INTO {FTS_TABLE} (rowid, sid, body) "  # noqa: S608
            "SELECT m.id, e.session_id, e.content || char(10) || e.name "
            f"FROM {MAP_TABLE} m JOIN {_EVENT_TABLE} e ON e.id = m.event_id WHERE m.id > %s",
            [top],
        )
        cursor.execute(
            f"INSERT INTO {STATE_TABLE} (session_id, indexed_seq) VALUES (%s, %s) "  # noqa: S608
            "ON CONFLICT (session_id) DO UPDATE SET indexed_seq = excluded.indexed_seq",
            [sid, last],
        )
    return count


def _index_scope(*, session_id: uuid.UUID | None = None, owner_id: Any | None = None) -> None:
    """Before a search: index what the background task has not reached yet in the scope (one
    session, an owner's sessions, or all), so the query runs on the index. PostgreSQL does it
    for one session only (a cross-session query covers unindexed rows itself), and skips rows
    the task holds at that moment (the query covers those too)."""
    if connection.vendor == "postgresql" and session_id is not None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {_EVENT_TABLE} WHERE session_id = %s "  # noqa: S608
                f"AND {VECTOR_COLUMN} IS NULL LIMIT 1",
                [session_id],
            )
            stale = cursor.fetchone() is not None
        if stale:
            search_index_pending(session_id=session_id)
        return
    if connection.vendor != "sqlite":
        return
    if session_id is not None:
        _sqlite_index(session_id)
        return
    for pk in _sqlite_pending_sessions(owner_id=owner_id):
        _sqlite_index(pk)


def _sqlite_pending_sessions(*, owner_id: Any | None = None) -> list[uuid.UUID]:
    sql = (
        f"SELECT s.id FROM {_SESSION_TABLE} s LEFT JOIN {STATE_TABLE} st "  # noqa: S608
        "ON st.session_id = s.id WHERE s.last_seq > coalesce(st.indexed_seq, 0)"
    )
    params: list[Any] = []
    if owner_id is not None:
        sql += " AND s.owner_id = %s"
        params.append(owner_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [pk if isinstance(pk, uuid.UUID) else uuid.UUID(pk) for (pk,) in cursor.fetchall()]


def search_index_everything(*, batch: int = 500) -> int:
    """Index every session's events the index lacks; returns how many were indexed. The task
    appends queue (coalesced, see receivers.py): one pass covers all the sessions appended to
    meanwhile. Idempotent, like `search_index_pending`."""
    if connection.vendor == "sqlite":
        return sum(_sqlite_index(pk) for pk in _sqlite_pending_sessions())
    if connection.vendor != "postgresql":
        return 0
    return _pg_index("", [], batch=batch)


# --- recall ----------------------------------------------------------------------------------


@dataclass
class Recalled:
    messages: list[dict[str, Any]]
    system: str | None
    events: list[Event]
    token_count: int
    max_tokens: int
    omitted: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)


def _recallable(event: Event) -> bool:
    return is_model_visible(event.type, event.content) and not event.reverted


def _with_tool_partners(session: Session, events: Iterable[Event]) -> dict[int, list[Event]]:
    """For each event, the events that must travel with it: a TOOL_CALL and its results."""
    call_ids = {
        event.tool_call_id
        for event in events
        if event.type in (EventType.TOOL_CALL, EventType.TOOL_RESULT) and event.tool_call_id
    }
    partners: dict[str, list[Event]] = {}
    if call_ids:
        for event in Event.objects.filter(
            session=session,
            tool_call_id__in=call_ids,
            type__in=(EventType.TOOL_CALL, EventType.TOOL_RESULT),
        ).order_by("seq"):
            partners.setdefault(event.tool_call_id, []).append(event)
    units: dict[int, list[Event]] = {}
    for event in events:
        group = partners.get(event.tool_call_id) if event.tool_call_id else None
        units[event.seq] = group if group else [event]
    return units


def recall(
    *,
    session: Session,
    text: str | None = None,
    seqs: Sequence[int] | None = None,
    max_tokens: int = RECALL_DEFAULT_TOKENS,
    fmt: str = "openai",
) -> Recalled:
    """Original events of `session` as messages ready to send, within `max_tokens`.

    Candidates are the RECALL_CANDIDATES best-ranked events matching `text`, or the events
    with the given `seqs`; they fill the budget newest first. Each candidate is taken with its tool partners
    (a TOOL_CALL and its TOOL_RESULTs are never split) if the whole unit still fits the
    budget; a candidate that does not fit is listed in `omitted`, and the next ones are tried.
    The chosen events are sent in seq order, with their original content (a cleared tool
    result's original, not its placeholder). Events never sent to a model
    (LOCAL_SYSTEM_MESSAGE, a trim's empty marker, a reverted run's summary) are not recalled.
    """
    missing: list[int] = []
    if text is not None:
        query = parse_query(text)
        _index_scope(session_id=session.pk)
        ranked = (
            _ranked_events(query, session_id=session.pk, owner_id=None, limit=RECALL_CANDIDATES)
            if query is not None
            else []
        )
        ids = [event.pk for event in ranked]
        # Every hit holds every word of the query; of the best-ranked ones, the newest win
        # the budget, as in /context's newest-first fill.
        candidates = sorted(Event.objects.filter(pk__in=ids), key=lambda event: -event.seq)
    else:
        wanted = list(dict.fromkeys(seqs or []))
        found = {e.seq: e for e in Event.objects.filter(session=session, seq__in=wanted)}
        missing = [seq for seq in wanted if seq not in found]
        candidates = sorted(found.values(), key=lambda event: -event.seq)
    candidates = [event for event in candidates if _recallable(event)]
    units = _with_tool_partners(session, candidates)

    chosen: dict[int, Event] = {}
    used = 0
    omitted: list[int] = []
    for event in candidates:
        unit = [member for member in units[event.seq] if member.seq not in chosen]
        cost = sum(member.token_count for member in unit)
        if used + cost > max_tokens:
            omitted.append(event.seq)
            continue
        used += cost
        for member in unit:
            chosen[member.seq] = member
    ordered = [chosen[seq] for seq in sorted(chosen)]
    originals = []
    for event in ordered:
        # Recall returns what was recorded: a copy without clear_tool_results' placeholder.
        original = copy.copy(event)
        original.cleared_content = None
        originals.append(original)
    messages, system = render_messages(originals, fmt=fmt)
    return Recalled(
        messages=messages,
        system=system,
        events=ordered,
        token_count=used,
        max_tokens=max_tokens,
        omitted=omitted,
        missing=missing,
    )


def session_has_recallable(*, session: Session) -> bool:
    """Whether the session holds originals the active context does not: events folded by a
    compaction or tool results cleared to a placeholder."""
    return (
        Event.objects.filter(session=session)
        .filter(Q(compacted_by__isnull=False) | Q(cleared_content__isnull=False))
        .exists()
    )


_RECALL_DESCRIPTION = (
    "Fetch original messages of this conversation that were compacted out of your context "
    "(folded into the summary, or tool results replaced by a placeholder). Give `query` "
    "(keywords, identifiers, file paths, error codes) to search them, or `seqs` to fetch the "
    "events a summary line cites, e.g. [#812] or [#812-#840] → [812, ..., 840]."
)
_RECALL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Words, identifiers or paths to search for in the earlier messages.",
        },
        "seqs": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "maxItems": RECALL_MAX_SEQS,
            "description": "Sequence numbers of the events to fetch, as cited in the summary.",
        },
        "maxTokens": {
            "type": "integer",
            "minimum": 1,
            "description": f"Token budget for the recalled messages (default {RECALL_DEFAULT_TOKENS}).",
        },
    },
}


def recall_tool(*, fmt: str = "openai") -> dict[str, Any]:
    """The `ledger_recall` function-tool definition in a provider's format. Its arguments are
    the body of `POST /api/v1/sessions/{id}/recall`."""
    if fmt == "anthropic":
        return {
            "name": RECALL_TOOL_NAME,
            "description": _RECALL_DESCRIPTION,
            "input_schema": copy.deepcopy(_RECALL_PARAMETERS),
        }
    return {
        "type": "function",
        "function": {
            "name": RECALL_TOOL_NAME,
            "description": _RECALL_DESCRIPTION,
            "parameters": copy.deepcopy(_RECALL_PARAMETERS),
        },
    }
