"""A Python client for the Context Ledger REST API and its websocket, over httpx.

`Client` is synchronous, `AsyncClient` asynchronous; both return the same typed results and
raise one exception class, :class:`LedgerError`, carrying the API's error code. Pure module: no
Django import, so agents and LangGraph apps use it in their own processes.

Events get a client-side UUID when the caller gives none, so a retried append (after a timeout
or a dropped connection) returns the stored event instead of storing a duplicate.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

__all__ = [
    "AsyncClient",
    "Client",
    "Compaction",
    "Context",
    "Event",
    "LedgerError",
    "RecallResult",
    "SearchHit",
    "Session",
    "SessionSummary",
    "Usage",
]

FINISHED = ("completed", "failed")
# Transport failures and these statuses are retried; appends are safe to retry because every
# event carries a client-supplied id.
RETRY_STATUSES = (502, 503, 504)


class LedgerError(Exception):
    """An API error (`code` is the body's `error`, e.g. `not_found`, `idempotency_conflict`),
    a transport failure (`code="connection_error"`) or a client-side timeout (`"timeout"`)."""

    def __init__(
        self, code: str, detail: str = "", *, status: int | None = None, body: Any = None
    ) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail
        self.status = status
        self.body = body


# --- typed results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    id: str
    title: str
    model: str
    encoding: str
    context_limit: int
    context_tokens: int
    event_count: int
    settings: dict[str, Any]
    owner: str
    last_compaction: Any
    created_at: str
    updated_at: str

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Session:
        return cls(
            id=str(data["id"]),
            title=data.get("title", ""),
            model=data["model"],
            encoding=data.get("encoding", ""),
            context_limit=data["contextLimit"],
            context_tokens=data.get("contextTokens", 0),
            event_count=data.get("eventCount", 0),
            settings=dict(data.get("settings") or {}),
            owner=data.get("owner", ""),
            last_compaction=data.get("lastCompaction"),
            created_at=data.get("createdAt", ""),
            updated_at=data.get("updatedAt", ""),
        )


@dataclass(frozen=True)
class Event:
    id: str
    session_id: str
    seq: int
    type: str
    role: str
    content: Any
    name: str
    tool_call_id: str
    token_count: int
    token_usage: dict[str, Any] | None
    pinned: bool
    token_provenance: str
    metadata: dict[str, Any]
    compacted_by: str | None
    cleared: bool
    created_at: str

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Event:
        return cls(
            id=str(data["id"]),
            session_id=str(data.get("sessionId", "")),
            seq=data["seq"],
            type=data["type"],
            role=data.get("role", ""),
            content=data.get("content"),
            name=data.get("name") or "",
            tool_call_id=data.get("toolCallId") or "",
            token_count=data.get("tokenCount", 0),
            token_usage=data.get("tokenUsage"),
            pinned=bool(data.get("pinned", False)),
            token_provenance=data.get("tokenProvenance", "local"),
            metadata=dict(data.get("metadata") or {}),
            compacted_by=data.get("compactedBy"),
            cleared=bool(data.get("cleared", False)),
            created_at=data.get("createdAt", ""),
        )


@dataclass(frozen=True)
class Usage:
    total_prompt_tokens: int
    total_completion_tokens: int
    total_tokens: int
    # Events that carried provider usage (the API's reportedEventCount), not all events.
    reported_event_count: int
    context_tokens: int
    context_limit: int
    percent_used: float
    near_limit: bool
    at_limit: bool
    model: str
    encoding: str
    exact: bool
    cumulative_tokens: int
    refresh_threshold_tokens: int
    last_compaction: Any
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Usage:
        return cls(
            total_prompt_tokens=data["totalPromptTokens"],
            total_completion_tokens=data["totalCompletionTokens"],
            total_tokens=data["totalTokens"],
            reported_event_count=data["reportedEventCount"],
            context_tokens=data["contextTokens"],
            context_limit=data["contextLimit"],
            percent_used=data["percentUsed"],
            near_limit=data["nearLimit"],
            at_limit=data["atLimit"],
            model=data["model"],
            encoding=data["encoding"],
            exact=data["exact"],
            cumulative_tokens=data.get("cumulativeTokens", 0),
            refresh_threshold_tokens=data.get("refreshThresholdTokens", 0),
            last_compaction=data.get("lastCompaction"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Context:
    messages: list[dict[str, Any]]
    token_count: int
    limit: int
    pruned: bool
    summary: str | None
    system: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Context:
        return cls(
            messages=list(data["messages"]),
            token_count=data["tokenCount"],
            limit=data["limit"],
            pruned=bool(data.get("pruned", False)),
            summary=data.get("summary"),
            system=data.get("system"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Compaction:
    id: str
    session_id: str
    strategy: str
    trigger: str
    status: str
    tokens_before: int | None
    tokens_after: int | None
    events_before: int | None
    events_after: int | None
    reduction_percent: float | None
    summary_tokens: int | None
    error: str | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Compaction:
        return cls(
            id=str(data["id"]),
            session_id=str(data.get("sessionId", "")),
            strategy=data.get("strategy", ""),
            trigger=data.get("trigger", ""),
            status=data["status"],
            tokens_before=data.get("tokensBefore"),
            tokens_after=data.get("tokensAfter"),
            events_before=data.get("eventsBefore"),
            events_after=data.get("eventsAfter"),
            reduction_percent=data.get("reductionPercent"),
            summary_tokens=data.get("summaryTokens"),
            error=data.get("error"),
            created_at=data.get("createdAt"),
            started_at=data.get("startedAt"),
            finished_at=data.get("finishedAt"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class SessionSummary:
    summary: str
    summarized_message_ids: list[str]
    last_summarized_message_id: str | None
    token_count: int
    updated_at: str

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> SessionSummary:
        return cls(
            summary=data["summary"],
            summarized_message_ids=[str(i) for i in data.get("summarizedMessageIds", [])],
            last_summarized_message_id=data.get("lastSummarizedMessageId"),
            token_count=data.get("tokenCount", 0),
            updated_at=data.get("updatedAt", ""),
        )


@dataclass(frozen=True)
class SearchHit:
    """One search result; `raw` keeps every field the server sent."""

    event_id: str
    seq: int | None
    type: str
    snippet: str
    compacted: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> SearchHit:
        return cls(
            event_id=str(data.get("eventId") or data.get("id") or ""),
            seq=data.get("seq"),
            type=data.get("type", ""),
            snippet=data.get("snippet") or data.get("content") or "",
            compacted=bool(data.get("compacted") or data.get("compactedBy")),
            raw=dict(data),
        )


@dataclass(frozen=True)
class RecallResult:
    messages: list[dict[str, Any]]
    token_count: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> RecallResult:
        return cls(
            messages=list(data.get("messages", [])),
            token_count=data.get("tokenCount", 0),
            raw=dict(data),
        )


# --- request building, shared by both clients ---------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _event_body(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event for the API: snake_case keys accepted, a client id added when missing."""
    body = {_camel(key): value for key, value in event.items() if value is not None}
    body.setdefault("id", str(uuid.uuid4()))
    body["id"] = str(body["id"])
    return body


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        detail = body.get("detail")
        raise LedgerError(
            body["error"],
            detail if isinstance(detail, str) else json.dumps(detail, default=str),
            status=response.status_code,
            body=body,
        )
    raise LedgerError(
        f"http_{response.status_code}", str(body)[:500], status=response.status_code, body=body
    )


def _ws_url(base_url: str, session_id: str | None, token: str) -> str:
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    path = parts.path.rstrip("/") + (
        f"/ws/sessions/{quote(session_id)}/" if session_id else "/ws/sessions/"
    )
    return urlunsplit((scheme, parts.netloc, path, f"token={quote(token)}", ""))


def _session_body(
    model: str,
    title: str | None,
    context_limit: int | None,
    system_prompt: str | None,
    settings: Mapping[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if title is not None:
        body["title"] = title
    if context_limit is not None:
        body["contextLimit"] = context_limit
    if system_prompt is not None:
        body["systemPrompt"] = system_prompt
    if settings is not None:
        body["settings"] = dict(settings)
    return body


def _compaction_body(
    strategy: str | None, summarizer: str | None, extra: Mapping[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {_camel(k): v for k, v in extra.items()}
    if strategy is not None:
        body["strategy"] = strategy
    if summarizer is not None:
        body["summarizer"] = summarizer
    return body


def _hits(data: Any) -> list[SearchHit]:
    items = data.get("results", data.get("hits")) if isinstance(data, dict) else data
    return [SearchHit.from_api(item) for item in items or []]


class _Base:
    def __init__(self, base_url: str, token: str, *, retries: int, backoff: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retries = retries
        self.backoff = backoff
        self._headers = {"Authorization": f"Token {token}", "Accept": "application/json"}

    def _api(self, path: str) -> str:
        return f"{self.base_url}/api/v1/{path.lstrip('/')}"

    def watch(self, session_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Async iterator over the session's websocket messages (all visible sessions when
        `session_id` is None), as dicts: COMPACTION_START, COMPACTION_COMPLETE, USAGE_UPDATED…"""
        parts = urlsplit(self.base_url)
        # The server's own origin: servers that validate Origin for every websocket (not only
        # cookie-authenticated ones) accept it, and it is true, the client talks to that host.
        origin = f"{parts.scheme}://{parts.netloc}"
        return _watch(_ws_url(self.base_url, session_id, self.token), origin=origin)


async def _watch(url: str, *, origin: str) -> AsyncIterator[dict[str, Any]]:
    from websockets.asyncio.client import connect
    from websockets.datastructures import Headers
    from websockets.exceptions import ConnectionClosedError, InvalidStatus

    try:
        async with connect(
            url, open_timeout=10, additional_headers=Headers(Origin=origin)
        ) as socket:
            async for frame in socket:
                yield json.loads(frame)
    except InvalidStatus as exc:
        raise LedgerError("websocket_refused", str(exc), status=exc.response.status_code) from exc
    except ConnectionClosedError as exc:
        code = exc.rcvd.code if exc.rcvd else None
        raise LedgerError("websocket_closed", str(exc), status=code) from exc
    except OSError as exc:
        raise LedgerError("connection_error", str(exc)) from exc


# --- the synchronous client ----------------------------------------------------------------------


class Client(_Base):
    """Synchronous client. `Client("http://127.0.0.1:8000", token)`; use as a context manager
    or call `close()`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, retries=retries, backoff=backoff)
        self._http = httpx.Client(headers=self._headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.request(method, self._api(path), **kwargs)
            except httpx.TimeoutException as exc:
                if attempt >= self.retries:
                    raise LedgerError("timeout", str(exc)) from exc
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise LedgerError("connection_error", str(exc)) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    _raise_for(response)
                    return response.json() if response.content else None
            attempt += 1
            time.sleep(self.backoff * 2 ** (attempt - 1))

    # sessions
    def create_session(
        self,
        *,
        model: str,
        title: str | None = None,
        context_limit: int | None = None,
        system_prompt: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Session:
        body = _session_body(model, title, context_limit, system_prompt, settings)
        return Session.from_api(self._request("POST", "sessions", json=body))

    def get_session(self, session_id: str) -> Session:
        return Session.from_api(self._request("GET", f"sessions/{session_id}"))

    def list_sessions(self) -> list[Session]:
        """Every session the token's user may see (follows the pagination)."""
        sessions: list[Session] = []
        page = 1
        while True:
            data = self._request("GET", "sessions", params={"page": page})
            sessions += [Session.from_api(item) for item in data["results"]]
            if not data.get("next"):
                return sessions
            page += 1

    def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        context_limit: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Session:
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if context_limit is not None:
            body["contextLimit"] = context_limit
        if settings is not None:
            body["settings"] = dict(settings)
        return Session.from_api(self._request("PATCH", f"sessions/{session_id}", json=body))

    def delete_session(self, session_id: str) -> None:
        self._request("DELETE", f"sessions/{session_id}")

    # events
    def append(self, session_id: str, event: Mapping[str, Any]) -> Event:
        """Append one event (`{"type": ..., "content": ..., "id"?: ...}`; snake_case keys work)."""
        data = self._request("POST", f"sessions/{session_id}/events", json=_event_body(event))
        return Event.from_api(data)

    def append_many(self, session_id: str, events: Iterable[Mapping[str, Any]]) -> list[Event]:
        """Append a list of events atomically (all or none)."""
        body = [_event_body(event) for event in events]
        data = self._request("POST", f"sessions/{session_id}/events", json=body)
        return [Event.from_api(item) for item in data]

    def events(
        self, session_id: str, *, after: int = 0, include_compacted: bool = False, limit: int = 500
    ) -> list[Event]:
        """Every event after seq `after` (follows the cursor)."""
        events: list[Event] = []
        while True:
            params = {"after": after, "limit": limit, "includeCompacted": include_compacted}
            data = self._request("GET", f"sessions/{session_id}/events", params=params)
            events += [Event.from_api(item) for item in data["results"]]
            if data.get("nextAfter") is None:
                return events
            after = data["nextAfter"]

    def usage(self, session_id: str) -> Usage:
        return Usage.from_api(self._request("GET", f"sessions/{session_id}/usage"))

    def context(
        self,
        session_id: str,
        *,
        max_tokens: int | None = None,
        reserve_tokens: int | None = None,
        format: str = "openai",
    ) -> Context:
        params: dict[str, Any] = {"format": format}
        if max_tokens is not None:
            params["maxTokens"] = max_tokens
        if reserve_tokens is not None:
            params["reserveTokens"] = reserve_tokens
        return Context.from_api(
            self._request("GET", f"sessions/{session_id}/context", params=params)
        )

    def summary(self, session_id: str) -> SessionSummary:
        return SessionSummary.from_api(self._request("GET", f"sessions/{session_id}/summary"))

    # compactions
    def start_compaction(
        self,
        session_id: str,
        *,
        strategy: str | None = None,
        summarizer: str | None = None,
        **extra: Any,
    ) -> Compaction:
        body = _compaction_body(strategy, summarizer, extra)
        return Compaction.from_api(
            self._request("POST", f"sessions/{session_id}/compactions", json=body)
        )

    def plan_compaction(
        self, session_id: str, *, strategy: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        """A dry run: the plan (events to fold, projected tokensAfter…), nothing changed."""
        body = _compaction_body(strategy, None, {**extra, "dry_run": True})
        result: dict[str, Any] = self._request(
            "POST", f"sessions/{session_id}/compactions", json=body
        )
        return result

    def compaction(self, compaction_id: str) -> Compaction:
        return Compaction.from_api(self._request("GET", f"compactions/{compaction_id}"))

    def compactions(self, session_id: str) -> list[Compaction]:
        data = self._request("GET", f"sessions/{session_id}/compactions")
        items = data["results"] if isinstance(data, dict) else data
        return [Compaction.from_api(item) for item in items]

    def wait_compaction(
        self, compaction_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> Compaction:
        """Poll until the run is completed or failed; `LedgerError("timeout")` after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.compaction(compaction_id)
            if run.finished:
                return run
            if time.monotonic() > deadline:
                raise LedgerError("timeout", f"compaction {compaction_id} still {run.status}")
            time.sleep(poll)

    def revert_compaction(self, compaction_id: str) -> Compaction:
        return Compaction.from_api(self._request("POST", f"compactions/{compaction_id}/revert"))

    # search and recall
    def search(self, session_id: str, q: str, *, limit: int | None = None) -> list[SearchHit]:
        params: dict[str, Any] = {"q": q}
        if limit is not None:
            params["limit"] = limit
        return _hits(self._request("GET", f"sessions/{session_id}/search", params=params))

    def recall(
        self, session_id: str, query: str, *, max_tokens: int | None = None, **extra: Any
    ) -> RecallResult:
        body: dict[str, Any] = {"query": query, **{_camel(k): v for k, v in extra.items()}}
        if max_tokens is not None:
            body["maxTokens"] = max_tokens
        return RecallResult.from_api(
            self._request("POST", f"sessions/{session_id}/recall", json=body)
        )


# --- the asynchronous client ---------------------------------------------------------------------


class AsyncClient(_Base):
    """`Client`'s twin for asyncio code: the same methods, awaited."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        backoff: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, token, retries=retries, backoff=backoff)
        self._http = httpx.AsyncClient(headers=self._headers, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                response = await self._http.request(method, self._api(path), **kwargs)
            except httpx.TimeoutException as exc:
                if attempt >= self.retries:
                    raise LedgerError("timeout", str(exc)) from exc
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise LedgerError("connection_error", str(exc)) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                    _raise_for(response)
                    return response.json() if response.content else None
            attempt += 1
            await asyncio.sleep(self.backoff * 2 ** (attempt - 1))

    async def create_session(
        self,
        *,
        model: str,
        title: str | None = None,
        context_limit: int | None = None,
        system_prompt: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Session:
        body = _session_body(model, title, context_limit, system_prompt, settings)
        return Session.from_api(await self._request("POST", "sessions", json=body))

    async def get_session(self, session_id: str) -> Session:
        return Session.from_api(await self._request("GET", f"sessions/{session_id}"))

    async def list_sessions(self) -> list[Session]:
        sessions: list[Session] = []
        page = 1
        while True:
            data = await self._request("GET", "sessions", params={"page": page})
            sessions += [Session.from_api(item) for item in data["results"]]
            if not data.get("next"):
                return sessions
            page += 1

    async def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        context_limit: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Session:
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if context_limit is not None:
            body["contextLimit"] = context_limit
        if settings is not None:
            body["settings"] = dict(settings)
        return Session.from_api(await self._request("PATCH", f"sessions/{session_id}", json=body))

    async def delete_session(self, session_id: str) -> None:
        await self._request("DELETE", f"sessions/{session_id}")

    async def append(self, session_id: str, event: Mapping[str, Any]) -> Event:
        data = await self._request("POST", f"sessions/{session_id}/events", json=_event_body(event))
        return Event.from_api(data)

    async def append_many(
        self, session_id: str, events: Iterable[Mapping[str, Any]]
    ) -> list[Event]:
        body = [_event_body(event) for event in events]
        data = await self._request("POST", f"sessions/{session_id}/events", json=body)
        return [Event.from_api(item) for item in data]

    async def events(
        self, session_id: str, *, after: int = 0, include_compacted: bool = False, limit: int = 500
    ) -> list[Event]:
        events: list[Event] = []
        while True:
            params = {"after": after, "limit": limit, "includeCompacted": include_compacted}
            data = await self._request("GET", f"sessions/{session_id}/events", params=params)
            events += [Event.from_api(item) for item in data["results"]]
            if data.get("nextAfter") is None:
                return events
            after = data["nextAfter"]

    async def usage(self, session_id: str) -> Usage:
        return Usage.from_api(await self._request("GET", f"sessions/{session_id}/usage"))

    async def context(
        self,
        session_id: str,
        *,
        max_tokens: int | None = None,
        reserve_tokens: int | None = None,
        format: str = "openai",
    ) -> Context:
        params: dict[str, Any] = {"format": format}
        if max_tokens is not None:
            params["maxTokens"] = max_tokens
        if reserve_tokens is not None:
            params["reserveTokens"] = reserve_tokens
        return Context.from_api(
            await self._request("GET", f"sessions/{session_id}/context", params=params)
        )

    async def summary(self, session_id: str) -> SessionSummary:
        return SessionSummary.from_api(await self._request("GET", f"sessions/{session_id}/summary"))

    async def start_compaction(
        self,
        session_id: str,
        *,
        strategy: str | None = None,
        summarizer: str | None = None,
        **extra: Any,
    ) -> Compaction:
        body = _compaction_body(strategy, summarizer, extra)
        return Compaction.from_api(
            await self._request("POST", f"sessions/{session_id}/compactions", json=body)
        )

    async def plan_compaction(
        self, session_id: str, *, strategy: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        body = _compaction_body(strategy, None, {**extra, "dry_run": True})
        result: dict[str, Any] = await self._request(
            "POST", f"sessions/{session_id}/compactions", json=body
        )
        return result

    async def compaction(self, compaction_id: str) -> Compaction:
        return Compaction.from_api(await self._request("GET", f"compactions/{compaction_id}"))

    async def compactions(self, session_id: str) -> list[Compaction]:
        data = await self._request("GET", f"sessions/{session_id}/compactions")
        items = data["results"] if isinstance(data, dict) else data
        return [Compaction.from_api(item) for item in items]

    async def wait_compaction(
        self, compaction_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> Compaction:
        deadline = time.monotonic() + timeout
        while True:
            run = await self.compaction(compaction_id)
            if run.finished:
                return run
            if time.monotonic() > deadline:
                raise LedgerError("timeout", f"compaction {compaction_id} still {run.status}")
            await asyncio.sleep(poll)

    async def revert_compaction(self, compaction_id: str) -> Compaction:
        return Compaction.from_api(
            await self._request("POST", f"compactions/{compaction_id}/revert")
        )

    async def search(self, session_id: str, q: str, *, limit: int | None = None) -> list[SearchHit]:
        params: dict[str, Any] = {"q": q}
        if limit is not None:
            params["limit"] = limit
        return _hits(await self._request("GET", f"sessions/{session_id}/search", params=params))

    async def recall(
        self, session_id: str, query: str, *, max_tokens: int | None = None, **extra: Any
    ) -> RecallResult:
        body: dict[str, Any] = {"query": query, **{_camel(k): v for k, v in extra.items()}}
        if max_tokens is not None:
            body["maxTokens"] = max_tokens
        return RecallResult.from_api(
            await self._request("POST", f"sessions/{session_id}/recall", json=body)
        )
