"""The gateway's wire contract: what a wire format (Chat Completions, Responses, Messages,
Gemini's generateContent) provides, written down once; and what every wire shares (the SSE
framer, the route kinds). Pure: no Django, no ORM.

Each wire format is one package under `providers/` that satisfies `Wire` (mypy checks it
where the `PROVIDERS` registry is built, providers/__init__.py). The router never asks which
format it serves; it calls the contract, in the spirit of LiteLLM's per-provider configs
(`transform_request` / `transform_response`):

- `ROUTES` are the format's endpoints under its `PREFIX`, with the path's parameters (a
  Gemini model is named in the path); `complete_url` is where a conversation goes upstream.
- `parse_request` validates the few fields the gateway reads (everything else passes through
  untouched) and returns the request's units: the messages in conversation order, a
  top-level system prompt or instructions first.
- `to_client_message` turns one unit into what the ledger identifies (hash) and records
  (event drafts); `render_fitted` puts a per-thread fit back into the client's own shape,
  `with_context` puts the ledger's rendered messages into a body (the fallback ladder),
  `with_model` names another model (a fallback) in a body sent as it came.
- `reply_from_response` (transform_response), `usage` and `stream_accumulator` read the
  reply, plain or streamed; `error_body` / `stream_error` are the provider's error shapes,
  `count_tokens_body` its count_tokens answer.
- `cache_rules` is the provider's prompt cache (minimum, lifetime, explicit breakpoints or
  automatic), from its documentation: what a call's cache outcome is predicted with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from compaction_app.gateway.cache_outcome import CacheRules
from compaction_app.gateway.messages import ClientMessage, Reply
from compaction_app.gateway.shape import Plan
from sessions_app.storable import provider_loads

# A blank line: two line ends in a row, each `\r\n`, `\r` or `\n` (a `\r` followed by `\n` is
# one line end, not two).
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


class SSEFramer:
    """The one SSE framer every wire's stream accumulator reads through: bytes in, in
    whatever pieces they arrive, each complete event's `data:` payload out (its data lines
    joined by a newline, as the SSE spec joins them). Line ends may be `\n`, `\r\n` or
    `\r` (all three are SSE); an event ends at a blank line. A `\r` at the end of a piece is
    held back until the next piece says whether a `\n` follows it."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        return [payload for payload, _ in self.feed_events(chunk)]

    def feed_events(self, chunk: bytes) -> list[tuple[bytes, int]]:
        """Each complete event's payload, with where the event began in `chunk` (0 or less
        when it began in an earlier piece): what a relay may still hold back of it."""
        held = len(self._buffer)
        buffer = self._buffer + chunk if held else chunk
        # A trailing `\r` may be the first half of `\r\n`: not read until the next piece.
        limit = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
        events: list[tuple[bytes, int]] = []
        position = 0
        while (found := _BLANK_LINE.search(buffer, position, limit)) is not None:
            event = buffer[position : found.start()]
            if b"\r" in event:
                event = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            data = [
                line[5:].removeprefix(b" ")
                for line in event.split(b"\n")
                if line.startswith(b"data:")
            ]
            if data:
                events.append((b"\n".join(data), position - held))
            position = found.end()
        self._buffer = buffer[position:]
        return events


class SSEAccumulator:
    """What every wire's stream accumulator shares: the model asked for, the one framer,
    `done` / `errored`, and feeding each complete event's `data:` payload to `_data`, which
    each wire writes for its own events.

    An event a wire cannot read (well-formed JSON of another shape: `{"choices": 5}`, a
    `message_start` whose `message` is 5, Gemini `parts: 5`) ends the reading: `malformed`
    says why and `cut` where that event began in the piece last fed, so the relay forwards
    what came before it and ends the client's stream with the provider's error event
    (issue 42, row 1: a `TypeError` in the reader left the client's stream open with no end)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._framer = SSEFramer()
        self.done = False
        self.errored = False
        self.malformed = ""
        self.cut = 0

    def feed(self, chunk: bytes) -> None:
        if self.malformed:
            return
        for data, start in self._framer.feed_events(chunk):
            try:
                self._data(data)
            except Exception as exc:  # any shape a provider may send: never the relay's end
                self.malformed = f"{type(exc).__name__} reading {data[:120]!r}"
                self.cut = max(start, 0)
                return

    def _data(self, data: bytes) -> None:
        raise NotImplementedError


def sse_json(data: bytes) -> dict[str, Any] | None:
    """One SSE `data:` payload as a JSON object, or None for anything else (a torn or foreign
    line): a stream accumulator reads what it can and never fails the stream it follows."""
    try:
        payload = provider_loads(data)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def reply_of(
    message: ClientMessage,
    payload: dict[str, Any],
    *,
    model: str,
    usage_fields: Callable[[Any], dict[str, Any]],
    usage_parts: Callable[[Any], tuple[dict[str, int | None], ...]] | None = None,
) -> Reply:
    """A non-streamed reply: `message`, the model the provider names (else the request's) and
    the payload's usage, raw and read by the format's `usage_fields`."""
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return Reply(
        message=message,
        model=str(payload.get("model") or model),
        raw_usage=usage or {},
        priced_apart=usage_parts(usage or {}) if usage_parts is not None else (),
        **usage_fields(usage or {}),
    )


# Route kinds the router knows how to serve (views.py has one handler per kind).
CONVERSATION = "conversation"  # recorded, fitted, forwarded with failover
PASSTHROUGH = "passthrough"  # forwarded as sent (method, path, query, body), nothing recorded
COUNT_TOKENS = "count_tokens"  # answered by the ledger's own counter
MODELS = "models"  # the model registry in OpenAI's list shape


@dataclass(frozen=True)
class Route:
    """One endpoint under the wire's prefix. `path` is Django path syntax, relative to the
    prefix (`/gateway/<prefix>/`); a passthrough goes to the same path below the upstream
    base."""

    path: str
    kind: str
    name: str
    methods: tuple[str, ...] = ("POST",)
    # Fixed parameters the route adds to the path's own (Gemini: which action it is).
    params: tuple[tuple[str, str], ...] = ()


class ParsedRequest(NamedTuple):
    """The fields the gateway reads. `units` are the messages in conversation order, the
    top-level system prompt (or instructions) first when the wire keeps it apart.
    `continues`: the request holds only what is new after a conversation the provider keeps
    (Responses' `previous_response_id`): it is recorded after what the session holds, and
    forwarded as sent (the gateway cannot fit what it cannot see)."""

    model: str
    units: list[dict[str, Any]]
    stream: bool
    continues: bool = False
    # Recorded but forwarded as sent, never fitted: the request leans on a prefix the provider
    # keeps (Gemini's `cachedContent`), which fitting would contradict.
    unfitted: bool = False


class StreamAccumulator(Protocol):
    """Follows a streamed reply as its bytes are relayed and rebuilds the reply. `malformed`
    (why) and `cut` (where, in the piece last fed): an event it could not read (SSEAccumulator)."""

    done: bool
    errored: bool
    malformed: str
    cut: int

    def feed(self, chunk: bytes) -> None: ...

    def reply(self) -> Reply | None: ...


class Wire(Protocol):
    NAME: str
    # The URL prefix under /gateway/ that stands for the upstream base URL: a path below it
    # is the same path below the base (several wires share one: Chat Completions and
    # Responses are both OpenAI's /v1).
    PREFIX: str
    # How the ledger renders a fitted context for this wire (sessions_app.render's formats,
    # "openai" or "anthropic"), which `with_context` turns into the wire's own body.
    RENDER_FORMAT: str
    # The Django setting naming the upstream base URL.
    UPSTREAM_SETTING: str
    # A query parameter that may carry the provider key (Gemini's `?key=`, "" for none): moved
    # into the KEY_HEADER header when forwarded, so no URL the gateway builds holds a key.
    KEY_QUERY: str
    KEY_HEADER: str
    # The body field that holds the conversation (for error params).
    MESSAGES_PARAM: str
    ROUTES: tuple[Route, ...]

    def complete_url(
        self, base: str, *, model: str, stream: bool, params: Mapping[str, str]
    ) -> str: ...

    def parse_request(
        self, body: Any, params: Mapping[str, str] | None = None, *, checked: int = 0
    ) -> ParsedRequest:
        """`checked`: the first entries of the message array (MESSAGES_PARAM) are, byte for
        byte, those of a body this wire accepted earlier in the conversation
        (body.KnownBodies): their checks, which depend on nothing else, may be skipped."""
        ...

    def to_client_message(self, unit: dict[str, Any], index: int = 0) -> ClientMessage: ...

    def render_fitted(
        self, body: dict[str, Any], units: Sequence[dict[str, Any]], plan: Plan, model: str
    ) -> dict[str, Any]: ...

    def with_model(self, body: dict[str, Any], model: str) -> dict[str, Any]: ...

    def with_context(
        self,
        body: dict[str, Any],
        *,
        messages: list[dict[str, Any]],
        system: str | None,
        model: str,
    ) -> dict[str, Any]: ...

    def usage(self, raw: Any) -> dict[str, Any]: ...

    def reply_from_response(self, payload: Any, *, model: str) -> Reply | None: ...

    def stream_accumulator(self, model: str) -> StreamAccumulator: ...

    def error_body(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        param: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]: ...

    def stream_error(self, message: str) -> bytes: ...

    def count_tokens_body(self, count: int) -> dict[str, Any]: ...

    def cache_rules(self, model: str) -> CacheRules:
        """The provider's prompt cache for `model` (its package's cache.py): minimum,
        lifetime, explicit or automatic (cache_outcome.py predicts with them)."""
        ...
