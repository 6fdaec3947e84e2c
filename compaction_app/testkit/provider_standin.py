"""The provider stand-in: a real HTTP/1.1 server on 127.0.0.1 (random port) that speaks OpenAI
Chat Completions (`POST /v1/chat/completions`), OpenAI Responses (`POST /v1/responses`, with
`GET /v1/responses/{id}`, `/compact` and `/input_tokens`) and Anthropic Messages
(`POST /v1/messages`, and `POST /v1/messages/count_tokens`) and Google's Gemini API
(`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` (`?alt=sse`, or a
JSON array without it) and `:countTokens`, the same under `/v1/`), streamed or not, with usage,
scripted errors, malformed answers and pauses, and keeps every request it received (method,
path, headers, body and raw bytes: the real CLIs' traffic is captured with it).

Tests point the official SDKs, the CLIs, the summarizers and the gateway at it instead of
mocking them, so the real request encoding, response parsing and error classes are exercised.

    with ProviderStandIn() as upstream:
        upstream.script(rate_limited(retry_after=1), Step(text="hello"))
        client = openai.OpenAI(api_key="k", base_url=upstream.openai_url)
        ...
        assert upstream.requests[-1].body["model"] == "gpt-4o"

Steps are consumed one per request, in order; once the script is used up, `default` answers
(a plain success unless set otherwise). Each reply (success or error) is shaped in the wire
format of the endpoint that was called.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from compaction_app.testkit.prompt_cache import PromptCache

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
ANTHROPIC_COUNT_PATH = "/v1/messages/count_tokens"
# A Step text that makes the reply echo the request's last message ("Re: …"), so concurrent
# conversations get distinct replies.
ECHO = "__echo__"
RESPONSES_PATH = "/v1/responses"


@dataclass(frozen=True)
class Step:
    """What the stand-in does for one request.

    kind "reply": answer with `text` and `tool_calls` ((id, name, arguments JSON) triples),
    streamed when the request asks for it, `pause` seconds between streamed chunks; on the
    count_tokens route, the count of fake_token_count.
    kind "error": HTTP `status` with the provider's error body (and `headers`).
    kind "break": stream `chunks_before_break` chunks, then drop the connection.
    kind "stream_error": stream `chunks_before_break` chunks, then the provider's error event.
    kind "invalid_json": 200 with a body that is not JSON.
    kind "missing_fields": 200 with a JSON object lacking choices / content.
    kind "raw": 200 with `raw_body` as the JSON body, verbatim.
    kind "raw_stream": 200 `text/event-stream` with `raw_body` as the stream, verbatim, then
    the connection closed (whatever event shapes a test needs a provider to send).
    `delay` seconds are slept before answering (cut short when the stand-in closes).
    `prompt_tokens` None: the stand-in's own estimate (characters / 4). Cache figures are
    parts of it, reported as each provider does: OpenAI's `prompt_tokens_details.
    cached_tokens`; Anthropic's `cache_read_input_tokens`, `cache_creation_input_tokens` and
    its `cache_creation` split (`cache_write_1h_tokens` of the write at the one-hour rate);
    Gemini's `cachedContentTokenCount` (without a scripted figure, its implicit caching:
    ProviderStandIn.gemini_cached_tokens).
    """

    kind: str = "reply"
    text: str = "Hello from the stand-in."
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    status: int = 200
    message: str = "stand-in error"
    headers: tuple[tuple[str, str], ...] = ()
    pause: float = 0.0
    delay: float = 0.0
    prompt_tokens: int | None = None
    chunks_before_break: int = 2
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    raw_body: bytes = b""
    # Responses: a reasoning item with this opaque `encrypted_content` opens the output.
    reasoning: str = ""
    # Anthropic: a thinking block (this text, signed) opens the reply. Gemini: the reply
    # thought (`thoughtsTokenCount`, a signature on its last part when it calls nothing, a
    # `thought: true` part with this text when the request asks for thoughts).
    thinking: str = ""


def reply_text(text: str, *, delay: float = 0.0) -> Step:
    return Step(kind="reply", text=text, delay=delay)


def error(status: int, message: str = "", *, headers: dict[str, str] | None = None) -> Step:
    return Step(
        kind="error",
        status=status,
        message=message or f"stand-in error {status}",
        headers=tuple((headers or {}).items()),
    )


def rate_limited(*, retry_after: int = 1) -> Step:
    return error(429, "Rate limit reached", headers={"Retry-After": str(retry_after)})


def server_error(status: int = 500) -> Step:
    return error(status, "The server had an error while processing your request")


def overloaded() -> Step:
    """Anthropic's 529 overloaded_error."""
    return error(529, "Overloaded")


def unauthorized() -> Step:
    return error(401, "invalid x-api-key")


def slow(seconds: float, text: str = "too late") -> Step:
    return Step(kind="reply", text=text, delay=seconds)


def invalid_json() -> Step:
    return Step(kind="invalid_json")


def missing_fields() -> Step:
    return Step(kind="missing_fields")


def raw_json(body: Any) -> Step:
    """A 200 whose JSON body is exactly `body` (for odd shapes: null content, empty choices...)."""
    return Step(kind="raw", raw_body=json.dumps(body).encode())


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    # The forwarded body's bytes as they arrived (prefix-stability checks compare them).
    raw: bytes = b""
    method: str = "POST"
    # The query string, without its "?" (Gemini's `alt=sse`, `key=`).
    query: str = ""


@dataclass
class ProviderStandIn:
    default: Step = field(default_factory=Step)
    requests: list[Received] = field(default_factory=list)
    # A simulated prompt cache (testkit/prompt_cache.py): when set, a reply's cache figures
    # (and its prompt size) are what that cache read and wrote for the request, unless the
    # step scripts figures of its own.
    prompt_cache: PromptCache | None = None

    def __post_init__(self) -> None:
        self._script: list[Step] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # The bench turns this off: a long run would keep every request.
        self.keep_requests = True
        # Digests of every Gemini request's prefixes (model, instruction and tools, then
        # each turn in order), for implicit caching.
        self._gemini_prefixes: set[str] = set()

    def script(self, *steps: Step) -> None:
        """Queue steps, one per upcoming request."""
        with self._lock:
            self._script.extend(steps)

    def _next(self, received: Received) -> Step:
        with self._lock:
            if self.keep_requests:
                self.requests.append(received)
            return self._script.pop(0) if self._script else self.default

    def _cached(self, step: Step, body: dict[str, Any], *, anthropic: bool) -> Step:
        """`step` with the simulated cache's figures for `body` (see prompt_cache)."""
        scripted = (
            step.prompt_tokens is not None or step.cache_read_tokens or (step.cache_write_tokens)
        )
        if self.prompt_cache is None or step.kind == "error" or scripted:
            return step
        figures = (self.prompt_cache.anthropic if anthropic else self.prompt_cache.openai)(body)
        return dataclasses.replace(
            step,
            prompt_tokens=figures.prompt,
            cache_read_tokens=figures.read,
            cache_write_tokens=figures.write,
            cache_write_1h_tokens=figures.write_1h,
        )

    def gemini_cached_tokens(self, model: str, body: dict[str, Any]) -> int:
        """Gemini's implicit caching: the tokens of the longest run of leading items
        (instruction and tools, then the turns' parts) that an earlier request to `model` began with,
        when they reach GEMINI_IMPLICIT_CACHE_MIN; 0 otherwise."""
        digest = hashlib.sha256()
        digests, chars, matching = [], 0, True
        for item in _gemini_prefix(model, body):
            digest.update(item.encode())
            key = digest.hexdigest()  # of everything so far; the digest goes on
            digests.append(key)
            with self._lock:
                matching = matching and key in self._gemini_prefixes
            if matching:
                chars += len(item)
        with self._lock:
            if len(self._gemini_prefixes) > 200_000:  # a long bench run: forget, stay bounded
                self._gemini_prefixes.clear()
            self._gemini_prefixes.update(digests)
        tokens = chars // 4
        return tokens if tokens >= GEMINI_IMPLICIT_CACHE_MIN else 0

    @property
    def base(self) -> str:
        assert self._server is not None, "stand-in not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        return self.base + "/v1"

    @property
    def anthropic_url(self) -> str:
        return self.base

    @property
    def gemini_url(self) -> str:
        """As Google's `https://generativelanguage.googleapis.com`: the API version is part
        of each path (`/v1beta/models/…`, `/v1/models/…`)."""
        return self.base

    def start(self, port: int = 0) -> ProviderStandIn:
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        # Kept-alive connections hold a handler thread each: closing does not wait for them,
        # and delays wake on _closing, so no test waits on a slow reply at the end.
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="provider-standin",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ProviderStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def fake_token_count(body: dict[str, Any]) -> int:
    """The count-tokens route's answer: deterministic and additive, so tests can predict it.
    7 per request, plus len(system) // 3 + 2 for a system prompt, plus per turn 4 and
    len(text) // 3 for each text block."""
    total = 7
    system = body.get("system")
    if isinstance(system, str) and system:
        total += len(system) // 3 + 2
    for message in body.get("messages") or []:
        total += 4
        content = message.get("content")
        blocks = [{"text": content}] if isinstance(content, str) else content or []
        total += sum(len(block.get("text", "")) // 3 for block in blocks)
    return total


def _estimate(body: dict[str, Any]) -> int:
    return max(1, len(json.dumps(body.get("messages", []))) // 4)


def _openai_message(step: Step) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text or None, "refusal": None}
    if step.tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in step.tool_calls
        ]
    return message


def _openai_usage(step: Step, body: dict[str, Any]) -> dict[str, Any]:
    prompt = step.prompt_tokens if step.prompt_tokens is not None else _estimate(body)
    completion = max(1, len(step.text) // 4)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": step.cache_read_tokens, "audio_tokens": 0},
    }


def _anthropic_usage(step: Step, body: dict[str, Any]) -> dict[str, Any]:
    prompt = step.prompt_tokens if step.prompt_tokens is not None else _estimate(body)
    return {
        "input_tokens": prompt - step.cache_read_tokens - step.cache_write_tokens,
        "cache_creation_input_tokens": step.cache_write_tokens,
        "cache_read_input_tokens": step.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": step.cache_write_tokens - step.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": step.cache_write_1h_tokens,
        },
        "output_tokens": max(1, len(step.text) // 4),
    }


THINKING_SIGNATURE = "sig-standin-0001"


def _anthropic_blocks(step: Step) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if step.thinking:
        blocks.append(
            {"type": "thinking", "thinking": step.thinking, "signature": THINKING_SIGNATURE}
        )
    if step.text:
        blocks.append({"type": "text", "text": step.text})
    for i, n, a in step.tool_calls:
        blocks.append({"type": "tool_use", "id": i, "name": n, "input": json.loads(a)})
    return blocks


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if n < len(words) - 1 else "") for n, w in enumerate(words)]


def _openai_chunks(step: Step, body: dict[str, Any]) -> list[bytes]:
    model = body.get("model", "stand-in")
    base = {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
    }
    out = [
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            ],
        }
    ]
    for piece in _pieces(step.text):
        out.append(
            {**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        )
    for n, (i, name, args) in enumerate(step.tool_calls):
        out.append(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": n,
                                    "id": i,
                                    "type": "function",
                                    "function": {"name": name, "arguments": args},
                                }
                            ]
                        },
                        "finish_reason": None,
                    }
                ],
            }
        )
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append({**base, "choices": [], "usage": _openai_usage(step, body)})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in out] + [b"data: [DONE]\n\n"]


def _anthropic_events(step: Step, body: dict[str, Any]) -> list[bytes]:
    usage = _anthropic_usage(step, body)
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_standin",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "stand-in"),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
    ]
    index = 0
    if step.thinking:
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": step.thinking},
            {"type": "signature_delta", "signature": THINKING_SIGNATURE},
        ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": start},
            )
        )
        for delta in deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    if step.text:
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        )
        for piece in _pieces(step.text):
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    },
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for i, name, args in step.tool_calls:
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "tool_use", "id": i, "name": name, "input": {}},
                },
            )
        )
        events.append(
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": args},
                },
            )
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": "tool_use" if step.tool_calls else "end_turn",
                    "stop_sequence": None,
                },
                # Cumulative, as the API sends them: the input and cache figures again.
                "usage": {k: v for k, v in usage.items() if k != "cache_creation"},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


_ERROR_TYPES_ANTHROPIC = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_ERROR_TYPES_OPENAI = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "requests",
}


def _responses_usage(step: Step, body: dict[str, Any]) -> dict[str, Any]:
    prompt = (
        step.prompt_tokens
        if step.prompt_tokens is not None
        else max(1, len(json.dumps([body.get("instructions"), body.get("input")])) // 4)
    )
    completion = max(1, len(step.text) // 4)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": step.cache_read_tokens},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _responses_items(step: Step) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if step.reasoning:
        items.append(
            {
                "id": "rs_standin",
                "type": "reasoning",
                "summary": [],
                "encrypted_content": step.reasoning,
            }
        )
    if step.text:
        items.append(
            {
                "id": "msg_standin",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": step.text, "annotations": []}],
            }
        )
    for n, (i, name, args) in enumerate(step.tool_calls):
        items.append(
            {
                "id": f"fc_standin_{n}",
                "type": "function_call",
                "status": "completed",
                "call_id": i,
                "name": name,
                "arguments": args,
            }
        )
    return items


def _response(step: Step, body: dict[str, Any], *, status: str, done: bool) -> dict[str, Any]:
    return {
        "id": "resp_standin",
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": body.get("model", "stand-in"),
        "output": _responses_items(step) if done else [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "usage": _responses_usage(step, body) if done else None,
        "error": None,
        "incomplete_details": None,
        "metadata": {},
    }


def _responses_events(step: Step, body: dict[str, Any]) -> list[bytes]:
    """A Responses stream as the API sends it: typed events with sequence numbers."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": _response(step, body, status="in_progress", done=False),
        },
        {
            "type": "response.in_progress",
            "response": _response(step, body, status="in_progress", done=False),
        },
    ]
    for index, item in enumerate(_responses_items(step)):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append({"type": "response.content_part.added", **where, "part": part})
            for piece in _pieces(text):
                events.append(
                    {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
                )
            events.append(
                {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
            )
            events.append(
                {"type": "response.content_part.done", **where, "part": {**part, "text": text}}
            )
        elif item["type"] == "reasoning":
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": item}
            )
        else:
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            where = {"item_id": item["id"], "output_index": index}
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    **where,
                    "delta": item["arguments"],
                }
            )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append(
        {
            "type": "response.completed",
            "response": _response(step, body, status="completed", done=True),
        }
    )
    return [
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n".encode()
        for n, e in enumerate(events)
    ]


def _last_input_text(body: dict[str, Any]) -> Any:
    items = body.get("input")
    if isinstance(items, str) or not items:
        return items
    last = items[-1]
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return content[0].get("text")
    return (
        content if content is not None else (last.get("output") if isinstance(last, dict) else None)
    )


def _error_body(is_openai: bool, step: Step) -> dict[str, Any]:
    if is_openai:
        return {
            "error": {
                "message": step.message,
                "type": _ERROR_TYPES_OPENAI.get(step.status, "server_error"),
                "param": None,
                "code": None,
            }
        }
    return {
        "type": "error",
        "error": {
            "type": _ERROR_TYPES_ANTHROPIC.get(step.status, "api_error"),
            "message": step.message,
        },
    }


def _reply(step: Step, body: dict[str, Any], is_openai: bool) -> dict[str, Any]:
    if is_openai:
        return {
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "stand-in"),
            "choices": [
                {
                    "index": 0,
                    "message": _openai_message(step),
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": _openai_usage(step, body),
        }
    return {
        "id": "msg_standin",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "stand-in"),
        "content": _anthropic_blocks(step),
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(step, body),
    }


# Gemini (Google's Generative Language API): `/{version}/models/{model}:{method}`.
GEMINI_ROUTE = re.compile(
    r"^/(v1|v1beta)/models/([^/:]+):(generateContent|streamGenerateContent|countTokens)$"
)
# Gemini 3 signs its function calls (the first of each reply) and, when it thought, the last
# part of a text reply: opaque bytes, base64 on the wire (the SDKs decode them), that the
# client must send back as they came.
GEMINI_SIGNATURE = base64.b64encode(b"sig-standin-gemini-0001").decode()
# Implicit caching: what a request repeats of an earlier request to the same model, from its
# start (instruction and tools, then the turns' parts), is reported as
# `cachedContentTokenCount` once it reaches this many tokens (Gemini 2.5 Flash's minimum for
# implicit caching).
GEMINI_IMPLICIT_CACHE_MIN = 1024
_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _field(body: dict[str, Any], camel: str, snake: str) -> Any:
    """The API takes both spellings of a field (the SDKs send camelCase)."""
    value = body.get(camel)
    return value if value is not None else body.get(snake)


def gemini_error_body(status: int, message: str) -> dict[str, Any]:
    """Google's error shape: the HTTP code, a message and the canonical status name."""
    fallback = "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"
    return {
        "error": {
            "code": status,
            "message": message,
            "status": _GEMINI_STATUS.get(status, fallback),
        }
    }


def _gemini_texts(content: Any) -> list[str]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [
        p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]


def fake_gemini_token_count(body: dict[str, Any]) -> int:
    """countTokens' answer, as fake_token_count: 7 per request, plus len // 3 + 2 for the
    system instruction's text, plus per content 4 and len(text) // 3 for each text part. The
    body is either `{"contents": …}` or `{"generateContentRequest": {…}}`."""
    request = _field(body, "generateContentRequest", "generate_content_request") or body
    total = 7
    system = "".join(_gemini_texts(_field(request, "systemInstruction", "system_instruction")))
    if system:
        total += len(system) // 3 + 2
    for content in request.get("contents") or []:
        total += 4 + sum(len(text) // 3 for text in _gemini_texts(content))
    return total


def _gemini_estimate(body: dict[str, Any]) -> int:
    prompt = [_field(body, "systemInstruction", "system_instruction"), body.get("contents")]
    return max(1, len(json.dumps(prompt + [body.get("tools")])) // 4)


def _gemini_prefix(model: str, body: dict[str, Any]) -> list[str]:
    """What implicit caching compares, in order: the model, the instruction and tools, then
    each part of each turn (with the turn's role)."""
    head = [
        model,
        _field(body, "systemInstruction", "system_instruction"),
        body.get("tools"),
        _field(body, "toolConfig", "tool_config"),
    ]
    items = [json.dumps(head, sort_keys=True)]
    for content in body.get("contents") or []:
        role = content.get("role") if isinstance(content, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else [content]:
            items.append(json.dumps([role, part], sort_keys=True))
    return items


def _gemini_last_text(body: dict[str, Any]) -> str:
    contents = body.get("contents") or [{}]
    return " ".join(_gemini_texts(contents[-1]))


def _gemini_usage(
    step: Step, body: dict[str, Any], cached: int, *, emitted: int | None = None
) -> dict[str, Any]:
    """usageMetadata as the API sends it: the prompt counts cached tokens in, thoughts are
    apart from the candidates and in the total; zero figures are left out (proto3 JSON).
    `emitted`: the candidate tokens so far, for a stream's earlier chunks."""
    prompt = step.prompt_tokens if step.prompt_tokens is not None else _gemini_estimate(body)
    calls = sum(len(name) + len(args) for _, name, args in step.tool_calls)
    candidates = max(1, (len(step.text) + calls) // 4) if emitted is None else emitted
    thoughts = max(1, len(step.thinking) // 4) if step.thinking else 0
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    cached = min(cached, prompt)
    if cached:
        usage["cachedContentTokenCount"] = cached
        usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def _gemini_includes_thoughts(body: dict[str, Any]) -> bool:
    config = _field(body, "generationConfig", "generation_config") or {}
    thinking = _field(config, "thinkingConfig", "thinking_config") or {}
    return bool(_field(thinking, "includeThoughts", "include_thoughts"))


def _gemini_parts(step: Step, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Thought summary (only when asked for), text, then the function calls; the first call
    carries the signature, or, without calls, the last part of a reply that thought."""
    parts: list[dict[str, Any]] = []
    if step.thinking and _gemini_includes_thoughts(body):
        parts.append({"text": step.thinking, "thought": True})
    if step.text or not step.tool_calls:
        parts.append({"text": step.text})
    for n, (call_id, name, args) in enumerate(step.tool_calls):
        part: dict[str, Any] = {
            "functionCall": {"id": call_id, "name": name, "args": json.loads(args)}
        }
        if n == 0:
            part["thoughtSignature"] = GEMINI_SIGNATURE
        parts.append(part)
    if step.thinking and not step.tool_calls:
        parts[-1]["thoughtSignature"] = GEMINI_SIGNATURE
    return parts


def _gemini_response(
    parts: list[dict[str, Any]], usage: dict[str, Any], model: str, *, finished: bool = True
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finished:
        # STOP for function calls too: Gemini has no "tool_use" finish reason.
        candidate["finishReason"] = "STOP"
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": "standin-gemini-0001",
    }


def _gemini_chunks(
    step: Step, body: dict[str, Any], model: str, cached: int
) -> list[dict[str, Any]]:
    """A stream as the API sends it: each chunk a whole GenerateContentResponse holding the
    new parts, every chunk with usageMetadata (candidate tokens so far), the finish reason
    on the last."""
    parts = _gemini_parts(step, body)
    groups: list[list[dict[str, Any]]] = []
    calls = [p for p in parts if "functionCall" in p]
    for part in parts:
        if "functionCall" in part:
            continue
        if part.get("thought") or not part["text"]:
            groups.append([part])
            continue
        pieces = _pieces(part["text"])
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            extra = (
                {"thoughtSignature": part["thoughtSignature"]}
                if last and "thoughtSignature" in part
                else {}
            )
            groups.append([{"text": piece, **extra}])
    if calls:
        groups.append(calls)  # the API sends a reply's calls together, whole
    chunks, emitted = [], 0
    for n, group in enumerate(groups):
        finished = n == len(groups) - 1
        emitted += sum(len(p.get("text", "")) for p in group if not p.get("thought"))
        usage = _gemini_usage(
            step, body, cached, emitted=None if finished else max(1, emitted // 4)
        )
        chunks.append(_gemini_response(group, usage, model, finished=finished))
    return chunks


def _gemini_model(model: str) -> dict[str, Any]:
    return {
        "name": f"models/{model}",
        "version": "001",
        "displayName": model,
        "inputTokenLimit": 1_048_576,
        "outputTokenLimit": 65_536,
        "supportedGenerationMethods": ["generateContent", "countTokens"],
    }


def _handler(standin: ProviderStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes; without this, Nagle's algorithm holds
        # the body until the client's delayed ACK (40 ms), as no real provider front end does.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # keep pytest output clean

        def do_HEAD(self) -> None:  # noqa: N802
            standin._next(self._received("HEAD", b""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            received = self._received("GET", b"")
            standin._next(received)
            if received.path.startswith(RESPONSES_PATH + "/"):
                answer = _response(Step(), {"model": "stand-in"}, status="completed", done=True)
                self._json(200, {**answer, "id": received.path.rsplit("/", 1)[1]})
                return
            if received.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "stand-in", "object": "model"}]})
                return
            if received.path == "/v1beta/models":
                self._json(200, {"models": [_gemini_model("gemini-2.5-flash")]})
                return
            if received.path.startswith("/v1beta/models/"):
                self._json(200, _gemini_model(received.path.rsplit("/", 1)[1]))
                return
            self._json(404, {"error": {"message": "no such route"}})

        def _received(self, method: str, raw: bytes) -> Received:
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            path, _, query = self.path.partition("?")
            return Received(
                path=path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                raw=raw,
                method=method,
                query=query,
            )

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            received = self._received("POST", raw)
            path, body = received.path, received.body
            step = standin._next(received)
            if path == RESPONSES_PATH + "/input_tokens":
                self._json(
                    200, {"object": "response.input_tokens", "input_tokens": _estimate(body)}
                )
                return
            if path == RESPONSES_PATH + "/compact":
                item = {"id": "cmp_standin", "type": "compaction", "encrypted_content": "opaque"}
                self._json(
                    200,
                    {
                        "id": "resp_compacted",
                        "object": "response.compaction",
                        "created_at": 0,
                        "output": [item],
                        "usage": _responses_usage(Step(), body),
                    },
                )
                return
            gemini = GEMINI_ROUTE.match(path)
            if gemini is not None:
                if step.delay and standin._closing.wait(step.delay):
                    return
                self._gemini(step, received, model=gemini.group(2), method=gemini.group(3))
                return
            if path.startswith("/v1beta/"):
                self._json(404, gemini_error_body(404, f"no such route: {path}"))
                return
            if path not in (OPENAI_PATH, ANTHROPIC_PATH, ANTHROPIC_COUNT_PATH, RESPONSES_PATH):
                self._json(404, {"error": {"message": "no such route"}})
                return
            if step.delay and standin._closing.wait(step.delay):
                return
            if step.text == ECHO:
                if path == RESPONSES_PATH:
                    last = _last_input_text(body)
                else:
                    last = (body.get("messages") or [{}])[-1].get("content")
                step = Step(**{**step.__dict__, "text": f"Re: {last}"})
            is_openai = path != ANTHROPIC_PATH and path != ANTHROPIC_COUNT_PATH
            request = body if isinstance(body, dict) else {}
            if path != ANTHROPIC_COUNT_PATH:
                step = standin._cached(step, request, anthropic=not is_openai)
            headers = dict(step.headers)
            if step.kind == "error":
                self._json(step.status, _error_body(is_openai, step), headers)
            elif step.kind == "invalid_json":
                self._send(200, b'{"id": "broken", "choices": [', headers)
            elif step.kind == "missing_fields":
                shape = {"id": "x", "object": "chat.completion"} if is_openai else {"id": "x"}
                self._json(200, shape, headers)
            elif step.kind == "raw":
                self._send(200, step.raw_body, headers)
            elif step.kind == "raw_stream":
                self._raw_stream(step.raw_body)
            elif path == ANTHROPIC_COUNT_PATH:
                self._json(200, {"input_tokens": fake_token_count(request)}, headers)
            elif request.get("stream"):
                self._stream(step, request, path)
            elif path == RESPONSES_PATH:
                self._json(200, _response(step, request, status="completed", done=True), headers)
            else:
                self._json(200, _reply(step, request, is_openai), headers)

        def _gemini(self, step: Step, received: Received, *, model: str, method: str) -> None:
            body = received.body if isinstance(received.body, dict) else {}
            headers = dict(step.headers)
            if step.text == ECHO:
                step = Step(**{**step.__dict__, "text": f"Re: {_gemini_last_text(body)}"})
            if step.kind == "error":
                self._json(step.status, gemini_error_body(step.status, step.message), headers)
                return
            if step.kind == "invalid_json":
                self._send(200, b'{"candidates": [', headers)
                return
            if step.kind == "missing_fields":
                self._json(200, {"modelVersion": model, "responseId": "x"}, headers)
                return
            if step.kind == "raw":
                self._send(200, step.raw_body, headers)
                return
            if step.kind == "raw_stream":
                self._raw_stream(step.raw_body)
                return
            if method == "countTokens":
                total = fake_gemini_token_count(body)
                details = [{"modality": "TEXT", "tokenCount": total}]
                self._json(200, {"totalTokens": total, "promptTokensDetails": details}, headers)
                return
            cached = step.cache_read_tokens or standin.gemini_cached_tokens(model, body)
            if method == "generateContent":
                usage = _gemini_usage(step, body, cached)
                self._json(200, _gemini_response(_gemini_parts(step, body), usage, model), headers)
                return
            # streamGenerateContent: SSE with `alt=sse` (`data: {…}` and CRLF CRLF, no [DONE]),
            # else one JSON array whose elements arrive as they are made.
            sse = "sse" in parse_qs(received.query).get("alt", [])
            chunks = _gemini_chunks(step, body, model, cached)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if sse else "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for number, chunk in enumerate(chunks):
                    if (
                        step.kind in ("break", "stream_error")
                        and number == step.chunks_before_break
                    ):
                        if step.kind == "stream_error":
                            error = json.dumps(gemini_error_body(500, "overloaded mid-stream"))
                            self.wfile.write(
                                f"data: {error}\r\n\r\n".encode()
                                if sse
                                else f",\r\n{error}]".encode()
                            )
                            self.wfile.flush()
                        return
                    data = json.dumps(chunk)
                    if sse:
                        self.wfile.write(f"data: {data}\r\n\r\n".encode())
                    else:
                        self.wfile.write(("[" if number == 0 else ",\r\n").encode() + data.encode())
                    self.wfile.flush()
                    if step.pause:
                        time.sleep(step.pause)
                if not sse:
                    self.wfile.write(b"]")
            except (BrokenPipeError, ConnectionResetError):
                return

        def _raw_stream(self, data: bytes) -> None:
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                self.wfile.write(data)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(payload).encode(), headers)

        def _send(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-request-id", "req_standin")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout); nothing to answer

        def _stream(self, step: Step, body: dict[str, Any], path: str) -> None:
            is_openai = path != ANTHROPIC_PATH
            if path == RESPONSES_PATH:
                chunks = _responses_events(step, body)
            else:
                chunks = _openai_chunks(step, body) if is_openai else _anthropic_events(step, body)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                for number, chunk in enumerate(chunks):
                    if (
                        step.kind in ("break", "stream_error")
                        and number == step.chunks_before_break
                    ):
                        if step.kind == "stream_error":
                            error = _error_body(
                                is_openai, Step(status=500, message="overloaded mid-stream")
                            )
                            if path == RESPONSES_PATH:
                                event = {
                                    "type": "error",
                                    "code": "server_error",
                                    "message": "overloaded mid-stream",
                                    "param": None,
                                    "sequence_number": number,
                                }
                                self.wfile.write(
                                    f"event: error\ndata: {json.dumps(event)}\n\n".encode()
                                )
                            elif is_openai:
                                self.wfile.write(f"data: {json.dumps(error)}\n\n".encode())
                            else:
                                self.wfile.write(
                                    f"event: error\ndata: {json.dumps(error)}\n\n".encode()
                                )
                            self.wfile.flush()
                        return
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    if step.pause:
                        time.sleep(step.pause)
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler


def main(argv: list[str] | None = None) -> None:
    """`python -m compaction_app.testkit.provider_standin --port 9100`: a provider to try the
    gateway with no provider key and no internet. Every call is answered with `--reply`
    (default: an echo of the last message), with usage, in each wire format."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--reply", default=ECHO, help="the reply text (default: echo)")
    args = parser.parse_args(argv)
    standin = ProviderStandIn(default=Step(text=args.reply))
    standin.keep_requests = False
    standin.start(port=args.port)
    print(
        f"provider stand-in on {standin.base}: "
        f"LEDGER_OPENAI_UPSTREAM={standin.openai_url} LEDGER_ANTHROPIC_UPSTREAM={standin.anthropic_url} "
        f"LEDGER_GEMINI_UPSTREAM={standin.gemini_url}",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        standin.close()


if __name__ == "__main__":
    main()
