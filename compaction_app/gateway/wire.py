"""The gateway's wire contract: what a wire format (Chat Completions, Responses, Messages)
provides, written down once. Pure: no Django, no ORM.

Each wire format is one module (`openai`, `responses`, `anthropic`) that satisfies `Wire`
(mypy checks it where `WIRES` is built). The router never asks which format it serves; it
calls the contract, in the spirit of LiteLLM's per-provider configs:

- `parse_request` validates the few fields the gateway reads (everything else passes through
  untouched) and returns the request's units: the messages in conversation order, a
  top-level system prompt or instructions first.
- `to_client_message` turns one unit into what the ledger identifies (hash) and records
  (event drafts); `with_context` (transform_request) puts fitted messages back into a body.
- `reply_from_response` (transform_response) and `stream_accumulator` read the reply,
  plain or streamed; `error_body` / `stream_error` are the provider's error shapes.
- `UPSTREAM_SETTING` + `UPSTREAM_PATH` choose the upstream; `ROUTES` are the format's own
  endpoints besides the conversation one (count_tokens, models, passthroughs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from compaction_app.gateway.messages import ClientMessage, Reply
from sessions_app.storable import provider_loads


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
    usage_fields: Callable[[Any], dict[str, int | None]],
) -> Reply:
    """A non-streamed reply: `message`, the model the provider names (else the request's) and
    the payload's usage, raw and read by the format's `usage_fields`."""
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return Reply(
        message=message,
        model=str(payload.get("model") or model),
        raw_usage=usage or {},
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


class StreamAccumulator(Protocol):
    """Follows a streamed reply as its bytes are relayed and rebuilds the reply."""

    done: bool
    errored: bool

    def feed(self, chunk: bytes) -> None: ...

    def reply(self) -> Reply | None: ...


class Wire(Protocol):
    NAME: str
    # The URL prefix under /gateway/ that stands for the upstream base URL: a path below it
    # is the same path below the base (several wires share one: Chat Completions and
    # Responses are both OpenAI's /v1).
    PREFIX: str
    # How the ledger renders a fitted context for this wire ("openai" or "anthropic").
    RENDER_FORMAT: str
    # How per-thread fitting reshapes the client's own request (shape.py): "openai" (Chat
    # messages), "anthropic" (Messages) or "responses" (input items).
    SHAPE_FORMAT: str
    # The Django setting naming the upstream base URL, and the conversation endpoint under it.
    UPSTREAM_SETTING: str
    UPSTREAM_PATH: str
    # The body field that holds the conversation (for error params).
    MESSAGES_PARAM: str
    ROUTES: tuple[Route, ...]

    def parse_request(self, body: Any) -> ParsedRequest: ...

    def to_client_message(self, unit: dict[str, Any], index: int = 0) -> ClientMessage: ...

    def with_context(
        self,
        body: dict[str, Any],
        *,
        messages: list[dict[str, Any]],
        system: str | None,
        model: str,
    ) -> dict[str, Any]: ...

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
