"""The dashboard's calls table: the filters a page's form sends, and the page it renders (a
session's calls, or every session's the user may see; staff: every user's). The numbers are
sessions_app.calls', the API's own."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.paginator import Paginator
from django.utils import timezone

from sessions_app import pricing
from sessions_app.calls import SORTS, CallFilters, calls_summary, calls_visible_to, ordered
from sessions_app.models import CallStatus, Session

PAGE_SIZE = 50
FIELDS = ("since", "until", "status", "model", "thread", "q", "session", "user", "sort")
# The table's sortable columns: (header, sort key).
COLUMNS = (
    ("Started", "started"),
    ("Session", "session"),
    ("Thread", "thread"),
    ("Model", "model"),
    ("Status", "status"),
    ("First byte", "ttfb"),
    ("Total", "total"),
    ("Tokens in / cached / write / out", "tokens"),
    ("Cost", "cost"),
    ("Fitted", "fitted"),
)


class BadFilter(ValueError):
    """A filter the page cannot apply (answered 400 with the form and its message)."""


def _moment(name: str, raw: str) -> datetime.datetime | None:
    """The form's datetime-local value (no offset: the viewer's time zone, as the page says),
    or RFC 3339."""
    if not raw:
        return None
    try:
        value = datetime.datetime.fromisoformat(raw.strip().upper().replace("Z", "+00:00"))
    except ValueError:
        raise BadFilter(f"{name}: not a date and time ({raw[:40]!r})") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.get_current_timezone())
    try:
        return value.astimezone(datetime.UTC)
    except OverflowError:
        raise BadFilter(f"{name}: out of range") from None


@dataclass(frozen=True)
class PageFilters:
    values: dict[str, str]
    filters: CallFilters
    page: int

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> PageFilters:
        values = {name: (params.get(name) or "").strip()[:200] for name in FIELDS}
        status = values["status"]
        if status and status not in CallStatus.values and status != "errors":
            raise BadFilter(f"status: unknown ({status[:40]!r})")
        statuses: tuple[str, ...] = ()
        if status == "errors":
            statuses = tuple(value for value in CallStatus.values if value != CallStatus.OK)
        elif status:
            statuses = (status,)
        try:
            page = max(int(params.get("page") or "1"), 1)
        except ValueError:
            page = 1
        session_id = None
        if values["session"]:
            try:
                session_id = uuid.UUID(values["session"])
            except ValueError:
                raise BadFilter("session: not a session id") from None
        user_id = None
        if values["user"]:
            if not values["user"].isdigit() or len(values["user"]) > 12:
                raise BadFilter("user: not a user id")
            user_id = int(values["user"])
        if values["sort"] and values["sort"].lstrip("-") not in SORTS:
            raise BadFilter(f"sort: unknown ({values['sort'][:40]!r})")
        return cls(
            values=values,
            filters=CallFilters(
                since=_moment("from", values["since"]),
                until=_moment("until", values["until"]),
                statuses=statuses,
                model=values["model"] or None,
                thread=values["thread"] or None,
                search=values["q"] or None,
                session_id=session_id,
                user_id=user_id,
            ),
            page=page,
        )

    def query_string(self, **changes: Any) -> str:
        values: dict[str, Any] = {**self.values, "page": self.page, **changes}
        if values["page"] == 1:
            values["page"] = ""
        return urlencode({k: v for k, v in values.items() if v})


def calls_page(
    *,
    user: AbstractBaseUser | AnonymousUser,
    params: Mapping[str, str],
    session: Session | None = None,
) -> dict[str, Any]:
    """The template context of a calls page (BadFilter for a filter it cannot apply)."""
    page_filters = PageFilters.from_query(params)
    staff = bool(getattr(user, "is_staff", False))
    if page_filters.filters.user_id is not None and not staff:
        raise BadFilter("user: only staff may filter by user")
    queryset = calls_visible_to(user=user, session=session, filters=page_filters.filters)
    queryset = ordered(queryset, page_filters.values["sort"] or None)
    if session is None:
        queryset = queryset.select_related("session", "owner")
    paginator = Paginator(queryset, PAGE_SIZE)
    page = paginator.get_page(page_filters.page)
    rows = [
        {
            "call": call,
            "cost_usd": pricing.usd(call.cost_nano_usd) if call.cost_nano_usd is not None else None,
            "tokens": (call.prompt_tokens or 0) + (call.completion_tokens or 0)
            if call.prompt_tokens is not None or call.completion_tokens is not None
            else None,
        }
        for call in page.object_list
    ]
    return {
        "page": page,
        "rows": rows,
        "summary": calls_summary(queryset),
        "values": page_filters.values,
        "statuses": CallStatus.values,
        "prev_qs": page_filters.query_string(page=page.previous_page_number())
        if page.has_previous()
        else None,
        "next_qs": page_filters.query_string(page=page.next_page_number())
        if page.has_next()
        else None,
        "session": session,
        "all_users": session is None and bool(getattr(user, "is_staff", False)),
        "tz_name": timezone.get_current_timezone_name(),
        "columns": [
            {
                "title": title,
                "key": key,
                "qs": page_filters.query_string(
                    page=1, sort=key if page_filters.values["sort"] == "-" + key else "-" + key
                ),
                "current": page_filters.values["sort"].lstrip("-") == key
                or (not page_filters.values["sort"] and key == "started"),
                "descending": page_filters.values["sort"].startswith("-")
                or not page_filters.values["sort"],
            }
            for title, key in COLUMNS
            if key != "session" or session is None
        ],
        # The API reads RFC 3339 moments: the form's local times are sent with their offset.
        "export_qs": page_filters.query_string(
            page=1,
            export="csv",
            since=page_filters.filters.since.isoformat() if page_filters.filters.since else "",
            until=page_filters.filters.until.isoformat() if page_filters.filters.until else "",
        ),
        "staff": staff,
    }
