"""A Python client for the Context Ledger REST API and its websocket, over httpx.

`Client` is synchronous, `AsyncClient` asynchronous; both return the same typed results and
raise one exception class, :class:`LedgerError`, carrying the API's error code. Pure module: no
Django import, so agents and LangGraph apps use it in their own processes.

Events get a client-side UUID when the caller gives none, so a retried append (after a timeout
or a dropped connection) returns the stored event instead of storing a duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload
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


# An operation (every API method, written once on _Base) is a generator: it yields the I/O it
# needs, a _Send or a _Pause, gets the answer back, and returns the method's result. The two
# clients differ only in how they carry out those two kinds of I/O (Client._run, AsyncClient._run).


@dataclass(frozen=True)
class _Send:
    """Send one HTTP request; the answer is the httpx.Response, or the transport error thrown in."""

    method: str
    url: str
    params: Mapping[str, Any] | None = None
    json: Any = None

    @property
    def request(self) -> dict[str, Any]:
        """The arguments of httpx's `request`."""
        return {"method": self.method, "url": self.url, "params": self.params, "json": self.json}


@dataclass(frozen=True)
class _Pause:
    """Wait this long (a retry's backoff, a poll's interval); the answer is None."""

    seconds: float


_Step = _Send | _Pause
_T = TypeVar("_T")
_P = ParamSpec("_P")
_Transport = TypeVar("_Transport", httpx.BaseTransport, httpx.AsyncBaseTransport)
_Op = Generator[_Step, Any, _T]


class _Steps:
    """Carries an operation's steps to its client and the answers back."""

    def __init__(self, op: _Op[_T]) -> None:
        self._op = op
        self.reply: Any = None
        self._error: BaseException | None = None
        self.result: Any = None

    def next(self) -> _Step | None:
        """The next I/O to do, or None when the operation has its result."""
        reply, error = self.reply, self._error
        self.reply = self._error = None
        try:
            return self._op.throw(error) if error else self._op.send(reply)
        except StopIteration as stop:
            self.result = stop.value
            return None

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Around the I/O of one step: a transport error becomes the operation's answer (it
        decides whether to retry); `reply` is the answer otherwise."""
        try:
            yield
        except httpx.TransportError as exc:
            self._error = exc


class _ApiMethod(Generic[_P, _T]):
    """One API method, written once as an operation on _Base. Read from a Client it is a plain
    method returning the result; read from an AsyncClient, a coroutine method (each client's
    `_bind` says how it runs the operation)."""

    def __init__(self, op: Callable[Concatenate[Any, _P], _Op[_T]]) -> None:
        self.op = op
        self.__doc__ = op.__doc__

    @overload
    def __get__(self, client: None, owner: type) -> _ApiMethod[_P, _T]: ...

    @overload
    def __get__(self, client: Client, owner: type | None = None) -> Callable[_P, _T]: ...

    @overload
    def __get__(
        self, client: AsyncClient, owner: type | None = None
    ) -> Callable[_P, Coroutine[Any, Any, _T]]: ...

    def __get__(self, client: Client | AsyncClient | None, owner: type | None = None) -> Any:
        return self if client is None else client._bind(self.op)


class _Base(Generic[_Transport]):
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        backoff: float = 0.5,
        transport: _Transport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retries = retries
        self.backoff = backoff
        self._headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self._http = self._open(timeout=timeout, transport=transport)

    def _open(self, *, timeout: float, transport: _Transport | None) -> Any:
        """The client's httpx client."""
        raise NotImplementedError

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

    # --- the API, written once -------------------------------------------------------------

    def _call(
        self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None
    ) -> _Op[Any]:
        """One API call: transport failures and RETRY_STATUSES are retried with exponential
        backoff; the decoded body is returned, an error answer raised as LedgerError."""
        attempt = 0
        while True:
            try:
                response = yield _Send(method, self._api(path), params, json)
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
            yield _Pause(self.backoff * 2 ** (attempt - 1))

    # sessions
    @_ApiMethod
    def create_session(
        self,
        *,
        model: str,
        title: str | None = None,
        context_limit: int | None = None,
        system_prompt: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> _Op[Session]:
        body = _session_body(model, title, context_limit, system_prompt, settings)
        return Session.from_api((yield from self._call("POST", "sessions", json=body)))

    @_ApiMethod
    def get_session(self, session_id: str) -> _Op[Session]:
        return Session.from_api((yield from self._call("GET", f"sessions/{session_id}")))

    @_ApiMethod
    def list_sessions(self) -> _Op[list[Session]]:
        """Every session the token's user may see (follows the pagination)."""
        sessions: list[Session] = []
        page = 1
        while True:
            data = yield from self._call("GET", "sessions", params={"page": page})
            sessions += [Session.from_api(item) for item in data["results"]]
            if not data.get("next"):
                return sessions
            page += 1

    @_ApiMethod
    def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        context_limit: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> _Op[Session]:
        body: dict[str, Any] = {}
        if title is not None:
            body["title"] = title
        if context_limit is not None:
            body["contextLimit"] = context_limit
        if settings is not None:
            body["settings"] = dict(settings)
        return Session.from_api(
            (yield from self._call("PATCH", f"sessions/{session_id}", json=body))
        )

    @_ApiMethod
    def delete_session(self, session_id: str) -> _Op[None]:
        yield from self._call("DELETE", f"sessions/{session_id}")

    # events
    @_ApiMethod
    def append(self, session_id: str, event: Mapping[str, Any]) -> _Op[Event]:
        """Append one event (`{"type": ..., "content": ..., "id"?: ...}`; snake_case keys work).
        The stored event comes back, its `content` None when longer than 262,144 characters
        (the server does not echo it; `events()` reads it back)."""
        path = f"sessions/{session_id}/events"
        return Event.from_api((yield from self._call("POST", path, json=_event_body(event))))

    @_ApiMethod
    def append_many(self, session_id: str, events: Iterable[Mapping[str, Any]]) -> _Op[list[Event]]:
        """Append a list of events atomically (all or none)."""
        body = [_event_body(event) for event in events]
        data = yield from self._call("POST", f"sessions/{session_id}/events", json=body)
        return [Event.from_api(item) for item in data]

    @_ApiMethod
    def events(
        self, session_id: str, *, after: int = 0, include_compacted: bool = False, limit: int = 500
    ) -> _Op[list[Event]]:
        """Every event after seq `after` (follows the cursor)."""
        events: list[Event] = []
        while True:
            params = {"after": after, "limit": limit, "includeCompacted": include_compacted}
            data = yield from self._call("GET", f"sessions/{session_id}/events", params=params)
            events += [Event.from_api(item) for item in data["results"]]
            if data.get("nextAfter") is None:
                return events
            after = data["nextAfter"]

    @_ApiMethod
    def usage(self, session_id: str) -> _Op[Usage]:
        return Usage.from_api((yield from self._call("GET", f"sessions/{session_id}/usage")))

    @_ApiMethod
    def context(
        self,
        session_id: str,
        *,
        max_tokens: int | None = None,
        reserve_tokens: int | None = None,
        format: str = "openai",
    ) -> _Op[Context]:
        params: dict[str, Any] = {"format": format}
        if max_tokens is not None:
            params["maxTokens"] = max_tokens
        if reserve_tokens is not None:
            params["reserveTokens"] = reserve_tokens
        path = f"sessions/{session_id}/context"
        return Context.from_api((yield from self._call("GET", path, params=params)))

    @_ApiMethod
    def summary(self, session_id: str) -> _Op[SessionSummary]:
        path = f"sessions/{session_id}/summary"
        return SessionSummary.from_api((yield from self._call("GET", path)))

    # compactions
    @_ApiMethod
    def start_compaction(
        self,
        session_id: str,
        *,
        strategy: str | None = None,
        summarizer: str | None = None,
        **extra: Any,
    ) -> _Op[Compaction]:
        body = _compaction_body(strategy, summarizer, extra)
        path = f"sessions/{session_id}/compactions"
        return Compaction.from_api((yield from self._call("POST", path, json=body)))

    @_ApiMethod
    def plan_compaction(
        self, session_id: str, *, strategy: str | None = None, **extra: Any
    ) -> _Op[dict[str, Any]]:
        """A dry run: the plan (events to fold, projected tokensAfter…), nothing changed."""
        body = _compaction_body(strategy, None, {**extra, "dry_run": True})
        path = f"sessions/{session_id}/compactions"
        result: dict[str, Any] = yield from self._call("POST", path, json=body)
        return result

    @_ApiMethod
    def compaction(self, compaction_id: str) -> _Op[Compaction]:
        return Compaction.from_api((yield from self._call("GET", f"compactions/{compaction_id}")))

    @_ApiMethod
    def compactions(self, session_id: str) -> _Op[list[Compaction]]:
        data = yield from self._call("GET", f"sessions/{session_id}/compactions")
        items = data["results"] if isinstance(data, dict) else data
        return [Compaction.from_api(item) for item in items]

    @_ApiMethod
    def wait_compaction(
        self, compaction_id: str, *, timeout: float = 60.0, poll: float = 0.2
    ) -> _Op[Compaction]:
        """Poll until the run is completed or failed; `LedgerError("timeout")` after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            data = yield from self._call("GET", f"compactions/{compaction_id}")
            run = Compaction.from_api(data)
            if run.finished:
                return run
            if time.monotonic() > deadline:
                raise LedgerError("timeout", f"compaction {compaction_id} still {run.status}")
            yield _Pause(poll)

    @_ApiMethod
    def revert_compaction(self, compaction_id: str) -> _Op[Compaction]:
        path = f"compactions/{compaction_id}/revert"
        return Compaction.from_api((yield from self._call("POST", path)))

    # search and recall
    @_ApiMethod
    def search(self, session_id: str, q: str, *, limit: int | None = None) -> _Op[list[SearchHit]]:
        params: dict[str, Any] = {"q": q}
        if limit is not None:
            params["limit"] = limit
        return _hits((yield from self._call("GET", f"sessions/{session_id}/search", params=params)))

    @_ApiMethod
    def recall(
        self, session_id: str, query: str, *, max_tokens: int | None = None, **extra: Any
    ) -> _Op[RecallResult]:
        body: dict[str, Any] = {"query": query, **{_camel(k): v for k, v in extra.items()}}
        if max_tokens is not None:
            body["maxTokens"] = max_tokens
        path = f"sessions/{session_id}/recall"
        return RecallResult.from_api((yield from self._call("POST", path, json=body)))


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


# --- the clients: only the I/O differs --------------------------------------------------------------


class Client(_Base[httpx.BaseTransport]):
    """Synchronous client. `Client("http://127.0.0.1:8000", token)`; use as a context manager
    or call `close()`. Options: `timeout` (seconds), `retries` and `backoff` (see _Base._call),
    `transport` (an httpx transport, e.g. for tests)."""

    def _open(self, *, timeout: float, transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(headers=self._headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bind(self, op: Callable[..., _Op[_T]]) -> Callable[..., _T]:
        @functools.wraps(op)
        def method(*args: Any, **kwargs: Any) -> _T:
            return self._run(op(self, *args, **kwargs))

        return method

    def _run(self, op: _Op[_T]) -> _T:
        steps = _Steps(op)
        while (step := steps.next()) is not None:
            with steps.answering():
                if isinstance(step, _Pause):
                    time.sleep(step.seconds)
                else:
                    steps.reply = self._http.request(**step.request)
        result: _T = steps.result
        return result


class AsyncClient(_Base[httpx.AsyncBaseTransport]):
    """`Client`'s twin for asyncio code: the same methods, awaited; `aclose()` or `async with`."""

    def _open(
        self, *, timeout: float, transport: httpx.AsyncBaseTransport | None
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(headers=self._headers, timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _bind(self, op: Callable[..., _Op[_T]]) -> Callable[..., Coroutine[Any, Any, _T]]:
        @functools.wraps(op)
        async def method(*args: Any, **kwargs: Any) -> _T:
            return await self._run(op(self, *args, **kwargs))

        return method

    async def _run(self, op: _Op[_T]) -> _T:
        steps = _Steps(op)
        while (step := steps.next()) is not None:
            with steps.answering():
                if isinstance(step, _Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    steps.reply = await self._http.request(**step.request)
        result: _T = steps.result
        return result
