"""Full-text search over every event of a session, folded ones included: the queries.

The index itself is described in `sessions_app/search_schema.py` and kept up to date by
`sessions_app/search_index.py`; recall (original events as messages within a token budget) is
`sessions_app/recall.py`. Here: turning what a user typed into a safe query, ranking, and
snippets (plain text and where the matches are in it: escaping and highlighting are the
page's business, not the API's).

A query is never passed to the search engine as typed. It is split into words on whitespace;
each word keeps only its letters and digits (the same split the index made) and becomes a
phrase, so `ERR_RATE_LIMITED` is the phrase `err rate limited` and `"`, `*`, `-`, `NEAR`,
`AND`, `:` and parentheses are plain text, never operators. Every word must match (AND); the
last word also matches as a prefix, so results appear while a word is being typed.
"""

from __future__ import annotations

import html
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DatabaseError, connection
from django.db.models import Q

from sessions_app.errors import InvalidInput
from sessions_app.models import Event, Session
from sessions_app.receivers import queue_index_pass
from sessions_app.search_index import index_scope
from sessions_app.search_schema import (
    DOCUMENT_FUNCTION,
    FTS_TABLE,
    MAP_TABLE,
    VECTOR_COLUMN,
)

logger = logging.getLogger("sessions_app.search")

MAX_QUERY_CHARS = 500
MAX_WORDS = 32
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
SNIPPET_CHARS = 240
# A prefix of one character would expand to most of the vocabulary.
MIN_PREFIX_CHARS = 2

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


def ranked_events(
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
    # Identifiers come from constants; the MATCH expression and values are parameters. A
    # large event is indexed in several pieces (search_index.CHUNK_CHARS): an event ranks by
    # its best piece and is listed once.
    sql = (
        # MATERIALIZED: bm25() only runs in the FTS query itself, never flattened into the
        # GROUP BY.
        f"WITH r AS MATERIALIZED (SELECT rowid, bm25({FTS_TABLE}, 0.0, 1.0) AS rank "  # noqa: S608
        f"  FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH %s) "
        f"SELECT {_HIT_COLUMNS} FROM ("
        "  SELECT m.event_id, min(r.rank) AS rank "
        f"  FROM r JOIN {MAP_TABLE} m ON m.id = r.rowid GROUP BY m.event_id"
        f") hits JOIN {_EVENT_TABLE} e ON e.id = hits.event_id "
        f"JOIN {_SESSION_TABLE} s ON s.id = e.session_id "
        f"WHERE 1 = 1 {scope} "
        "ORDER BY hits.rank, e.seq DESC LIMIT %s"
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


@dataclass(frozen=True)
class Snippet:
    """A piece of an event's text around its first match: plain text (whitespace runs as one
    space, `…` where it is cut) and each match's [start, end) in it, in characters."""

    text: str
    matches: tuple[tuple[int, int], ...] = ()

    def html(self) -> str:
        """The text HTML-escaped, every match in `<mark>` (the dashboard's rendering)."""
        parts: list[str] = []
        position = 0
        for start, end in self.matches:
            parts.append(html.escape(self.text[position:start]))
            parts.append("<mark>" + html.escape(self.text[start:end]) + "</mark>")
            position = end
        parts.append(html.escape(self.text[position:]))
        return "".join(parts)

    def marked(self, before: str, after: str) -> str:
        """The text with each match between `before` and `after` (plain-text emphasis)."""
        parts: list[str] = []
        position = 0
        for start, end in self.matches:
            parts.append(self.text[position:start] + before + self.text[start:end] + after)
            position = end
        return "".join(parts) + self.text[position:]


def snippet(text: str, pattern: re.Pattern[str], *, width: int = SNIPPET_CHARS) -> Snippet:
    """About `width` characters of `text` around its first match, and where every match
    inside it is; whitespace runs become one space, and `…` marks a cut."""
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
    lead = "…" if start > 0 else ""
    matches = tuple(
        (len(lead) + found.start(), len(lead) + found.end())
        for found in pattern.finditer(window)
        if found.end() > found.start()
    )
    return Snippet(text=lead + window + ("…" if cut_end else ""), matches=matches)


# --- search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchHit:
    event: Event
    snippet: Snippet

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
    return search_session_with_state(session=session, text=text, limit=limit)[0]


@dataclass(frozen=True)
class IndexProgress:
    """What a session search could see: `indexing` while events above `indexed_through`
    still wait for the index (SQLite only; they are found once the background pass reaches
    them)."""

    indexing: bool
    indexed_through: int


def search_session_with_state(
    *, session: Session, text: str, limit: int = DEFAULT_LIMIT
) -> tuple[list[SearchHit], IndexProgress]:
    """`search_session`, and how far the index covered the session when it ran. A search
    indexes at most one bounded batch itself (search_index.index_scope); when more is left it
    asks for the background pass and answers from what is indexed."""
    query = parse_query(text)
    state = index_scope(session_id=session.pk)
    if state is None:
        progress = IndexProgress(indexing=False, indexed_through=session.last_seq)
    else:
        progress = IndexProgress(indexing=state.pending, indexed_through=state.indexed_seq)
        if state.pending:
            queue_index_pass()
    if query is None:
        return [], progress
    events = ranked_events(query, session_id=session.pk, owner_id=None, limit=limit)
    return _hits(events, query), progress


def search_sessions(
    *, user: AbstractBaseUser | AnonymousUser, text: str, limit: int = DEFAULT_LIMIT
) -> list[SearchHit]:
    """Events matching `text` across the sessions `user` may see (staff: all), best first."""
    query = parse_query(text)
    if query is None:
        return []
    owner = None if getattr(user, "is_staff", False) else user.pk
    index_scope(owner_id=owner)
    return _hits(ranked_events(query, session_id=None, owner_id=owner, limit=limit), query)


def sessions_matching_content(*, text: str) -> Q | None:
    """A filter on Session for sessions holding an event that matches `text` (for the
    dashboard's list search), or None when `text` has nothing searchable."""
    query = parse_query(text)
    if query is None:
        return None
    index_scope()
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
