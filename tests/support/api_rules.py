"""The API's documented rules that its OpenAPI document cannot state, for schema-driven
testing: a JSON schema compares no two fields and knows nothing stored, so a request it
allows can still be refused by one of these. Generated valid requests are kept to them, so
schemathesis's "valid data is accepted" check (positive_data_acceptance) holds the API to
everything else the document says.

Each rule is documented where a client reads it (the field's description in the schema,
docs/api.md and docs/operations.md):
- no text stored from a body holds a NUL character, keys and nested values of `metadata` and
  of structured `content` included (plain strings carry the rule as a pattern);
- `compactThreshold` must not exceed `hardLimitThreshold`, the stored values (or the
  defaults) standing in for the ones a request leaves out;
- a usage's `cachedInputTokens` and `cacheWriteTokens` are parts of its `promptTokens`;
- a usage without `totalTokens` has `promptTokens + completionTokens` (its total) within the
  bound of a total;
- an event id appears at most once in one append;
- recall's `maxTokens` is at most the session's `contextLimit`;
- a compaction's `thread` names one of the session's threads;
- usage over time's `since` is before its `until`, at most 1,000 hours or days (`bucket`)
  apart, either left out taking its default (until: now; since: a day or 30 days before).

The rules read what is stored through a `StoredState`: the database in the in-process
schema test (tests/api/test_openapi_schema.py), the live server's API for `st run`
(tests/support/schemathesis_hooks.py). Pure: no Django import at module level.
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from sessions_app.session_settings import DEFAULTS


class StoredState(Protocol):
    """What the rules read of a session; None for a session that does not exist (or is not
    the caller's): any body is then a 404, so no rule applies."""

    def stored_settings(self, session_id: str) -> Mapping[str, Any] | None: ...

    def context_limit(self, session_id: str) -> int | None: ...

    def has_thread(self, session_id: str, key: str) -> bool | None: ...


def has_nul(value: object) -> bool:
    """Whether any string in a JSON value, object keys included, holds a NUL character."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(key) or has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(has_nul(item) for item in value)
    return False


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _usage_within_prompt(usage: Mapping[str, Any]) -> bool:
    parts = (_integer(usage.get("cachedInputTokens")) or 0) + (
        _integer(usage.get("cacheWriteTokens")) or 0
    )
    prompt = _integer(usage.get("promptTokens"))
    if prompt is not None and parts > prompt:
        return False
    if (
        _integer(usage.get("totalTokens")) is None
        and (prompt or 0) + (_integer(usage.get("completionTokens")) or 0) > 10**12
    ):
        return False
    return (_integer(usage.get("cacheWrite1hTokens")) or 0) <= (
        _integer(usage.get("cacheWriteTokens")) or 0
    )


def _distinct_ids(items: list[Any]) -> bool:
    seen: set[object] = set()
    for item in items:
        raw = item.get("id") if isinstance(item, dict) else None
        if not isinstance(raw, str):
            continue
        try:
            key: object = uuid.UUID(raw)
        except ValueError:
            key = raw
        if key in seen:
            return False
        seen.add(key)
    return True


# sessions_app.usage_over_time.MAX_PERIODS (that module needs Django; this one is imported
# by `st run`'s hooks without it). tests/api/test_openapi_schema.py checks they agree.
USAGE_MAX_PERIODS = 1000
_BUCKET = {"hour": datetime.timedelta(hours=1), "day": datetime.timedelta(days=1)}
_DATE_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _moment(raw: object) -> datetime.datetime | None:
    """An RFC 3339 date-time as the API reads it (a leap second is the next second's start);
    None if it is not one (then the schema, not a rule, is what refuses it)."""
    if not isinstance(raw, str) or not _DATE_TIME.fullmatch(raw):
        return None
    text = raw.upper().replace("Z", "+00:00")
    if text[17:19] == "60":
        text = text[:17] + "59" + text[19:]
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def _usage_range_within_bounds(query: Mapping[str, Any]) -> bool:
    # A parameter sent more than once is read as its last value, as Django reads it.
    last = {k: v[-1] if isinstance(v, list) and v else v for k, v in query.items()}
    bucket = _BUCKET.get(str(last.get("bucket") or "hour"))
    if bucket is None:
        return True  # not a bucket: the schema's business
    since, until = last.get("since"), last.get("until")
    end = _moment(until) if until is not None else datetime.datetime.now(datetime.UTC)
    start = _moment(since) if since is not None else None
    if end is None or (since is not None and start is None):
        return True
    try:
        if start is None:
            start = end - (24 if bucket == _BUCKET["hour"] else 30) * bucket
        span = end - start
    except OverflowError:  # past either end of the calendar: far more periods than allowed
        return False
    # The periods are whole local hours or days from the one holding `since`: a few more
    # than the span holds (its ends, a daylight-saving day of 23 hours).
    return span > datetime.timedelta(0) and span / bucket + 3 <= USAGE_MAX_PERIODS


def within_documented_rules(
    *,
    method: str,
    path: str,
    body: Any,
    path_parameters: Mapping[str, Any] | None,
    state: StoredState,
    query: Mapping[str, Any] | None = None,
) -> bool:
    """Whether a request (its operation's `path` template, e.g. /api/v1/sessions/{session_id},
    and what was generated for it) keeps every rule above."""
    method = method.upper()
    if path.endswith("/usage/calls") and not _usage_range_within_bounds(query or {}):
        return False
    session_id = (path_parameters or {}).get("session_id")
    session_id = session_id if isinstance(session_id, str) else None
    if has_nul(body):
        return False
    if method == "POST" and path.endswith("/events"):
        if isinstance(body, list) and not _distinct_ids(body):
            return False
        for item in body if isinstance(body, list) else [body]:
            usage = item.get("tokenUsage") if isinstance(item, dict) else None
            if isinstance(usage, dict) and not _usage_within_prompt(usage):
                return False
    if not isinstance(body, dict):
        return True
    max_tokens = _integer(body.get("maxTokens"))
    if path.endswith("/recall") and max_tokens is not None and session_id:
        window = state.context_limit(session_id)
        if window is not None and max_tokens > window:
            return False
    thread = body.get("thread")
    if (
        path.endswith("/compactions")
        and isinstance(thread, str)
        and session_id
        and state.has_thread(session_id, thread) is False
    ):
        return False
    changes = body.get("settings")
    if not isinstance(changes, dict) or not (
        path.endswith("/sessions") or path.endswith("{session_id}")
    ):
        return True
    base: dict[str, Any] = dict(DEFAULTS)
    if method == "PATCH" and session_id:
        stored = state.stored_settings(session_id)
        if stored is None:
            return True  # no such session: a 404 whatever the body
        base.update(stored)
    merged = {**base, **changes}
    compact = _number(merged.get("compactThreshold"))
    hard = _number(merged.get("hardLimitThreshold"))
    if compact is None or hard is None:
        return True  # a wrong type: the schema's business, not a rule between fields
    return compact <= hard
