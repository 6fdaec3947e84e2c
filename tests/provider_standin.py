"""A provider stand-in for the gateway tests and bench: a real HTTP/1.1 server on 127.0.0.1
that speaks OpenAI Chat Completions (`POST /v1/chat/completions`) and Anthropic Messages
(`POST /v1/messages`), streamed or not, with usage, scripted errors and pauses between
streamed chunks, and keeps every request it received.

    with ProviderStandIn() as upstream:
        upstream.script(Step(kind="error", status=429), Step(text="hello"))
        ...
        upstream.requests[-1].body["messages"]
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_PATH = "/v1/chat/completions"
# A Step text that makes the reply echo the request's last message ("Re: …"), so concurrent
# conversations get distinct replies.
ECHO = "__echo__"
ANTHROPIC_PATH = "/v1/messages"


@dataclass(frozen=True)
class Step:
    """What the stand-in does for one request.

    kind "reply": answer with `text` and `tool_calls` ((id, name, arguments JSON) triples),
    streamed when the request asks for it, `pause` seconds between streamed chunks.
    kind "error": HTTP `status` with the provider's error body.
    kind "break": stream `chunks_before_break` chunks, then drop the connection.
    kind "stream_error": stream `chunks_before_break` chunks, then the provider's error event.
    `prompt_tokens` None: the stand-in's own estimate (characters / 4). Cache figures are
    parts of it, reported as each provider does: OpenAI's `prompt_tokens_details.
    cached_tokens`; Anthropic's `cache_read_input_tokens`, `cache_creation_input_tokens` and
    its `cache_creation` split (`cache_write_1h_tokens` of the write at the one-hour rate).
    """

    kind: str = "reply"
    text: str = "Hello from the stand-in."
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    status: int = 200
    message: str = "stand-in error"
    pause: float = 0.0
    delay: float = 0.0
    prompt_tokens: int | None = None
    chunks_before_break: int = 2
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ProviderStandIn:
    default: Step = field(default_factory=Step)
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._script: list[Step] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.keep_requests = True

    def script(self, *steps: Step) -> None:
        with self._lock:
            self._script.extend(steps)

    def _next(self, received: Received) -> Step:
        with self._lock:
            if self.keep_requests:
                self.requests.append(received)
            return self._script.pop(0) if self._script else self.default

    @property
    def base(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        return self.base + "/v1"

    @property
    def anthropic_url(self) -> str:
        return self.base

    def start(self) -> ProviderStandIn:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ProviderStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def _anthropic_blocks(step: Step) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
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
    if step.text:
        events.append(
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
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
                        "index": 0,
                        "delta": {"type": "text_delta", "text": piece},
                    },
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
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
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                # Cumulative, as the API sends them: the input and cache figures again.
                "usage": {k: v for k, v in usage.items() if k != "cache_creation"},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


def _error_body(is_openai: bool, step: Step) -> dict[str, Any]:
    if is_openai:
        return {
            "error": {
                "message": step.message,
                "type": "server_error" if step.status >= 500 else "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    kinds = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}
    return {
        "type": "error",
        "error": {"type": kinds.get(step.status, "api_error"), "message": step.message},
    }


def _handler(standin: ProviderStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes; without this, Nagle's algorithm holds
        # the body until the client's delayed ACK (40 ms), as no real provider front end does.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            path = self.path.split("?", 1)[0]
            step = standin._next(
                Received(
                    path=path, headers={k.lower(): v for k, v in self.headers.items()}, body=body
                )
            )
            if path not in (OPENAI_PATH, ANTHROPIC_PATH):
                self._json(404, {"error": {"message": "no such route"}})
                return
            if step.delay:
                time.sleep(step.delay)
            if step.text == ECHO:
                last = (body.get("messages") or [{}])[-1].get("content")
                step = Step(**{**step.__dict__, "text": f"Re: {last}"})
            is_openai = path == OPENAI_PATH
            if step.kind == "error":
                self._json(step.status, _error_body(is_openai, step))
                return
            if body.get("stream"):
                self._stream(step, body, is_openai)
                return
            if is_openai:
                payload = {
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
            else:
                payload = {
                    "id": "msg_standin",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "stand-in"),
                    "content": _anthropic_blocks(step),
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": _anthropic_usage(step, body),
                }
            self._json(200, payload)

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-request-id", "req_standin")
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, step: Step, body: dict[str, Any], is_openai: bool) -> None:
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
                            if is_openai:
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
