"""Local HTTP servers that speak the OpenAI chat-completions and Anthropic messages wire formats.

Tests point the official SDKs at these servers instead of mocking them, so the real request
encoding, response parsing and error classes are exercised.

    with FakeProvider() as fake:
        fake.script(reply_text("## Status\\nok"), rate_limited(retry_after=1))
        client = openai.OpenAI(api_key="k", base_url=fake.openai_base_url)
        ...
        assert fake.requests[0].body["model"] == "gpt-4o"

Behaviours are consumed one per request, in order; once the script is used up, `default`
answers (a plain success unless set otherwise). The same server answers both
`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic), shaping each reply
(success or error) in the wire format of the endpoint that was called.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
ANTHROPIC_COUNT_PATH = "/v1/messages/count_tokens"


@dataclass(frozen=True)
class Behaviour:
    """What the server does for one request.

    kind: "reply" (success with `text`), "error" (HTTP `status` with a provider error body),
    "invalid_json" (200 with a body that is not JSON), "missing_fields" (200 with a JSON object
    lacking choices / content), "raw" (200 with `raw_body` as JSON content, verbatim).
    `delay` seconds are slept before answering (cut short when the server closes).
    """

    kind: str = "reply"
    text: str = "fake summary"
    status: int = 200
    message: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    raw_body: bytes = b""


def reply_text(text: str, *, delay: float = 0.0) -> Behaviour:
    return Behaviour(kind="reply", text=text, delay=delay)


def error(status: int, message: str = "", *, headers: dict[str, str] | None = None) -> Behaviour:
    return Behaviour(
        kind="error",
        status=status,
        message=message or f"fake error {status}",
        headers=tuple((headers or {}).items()),
    )


def rate_limited(*, retry_after: int = 1) -> Behaviour:
    return error(429, "Rate limit reached", headers={"Retry-After": str(retry_after)})


def server_error(status: int = 500) -> Behaviour:
    return error(status, "The server had an error while processing your request")


def overloaded() -> Behaviour:
    """Anthropic's 529 overloaded_error."""
    return error(529, "Overloaded")


def unauthorized() -> Behaviour:
    return error(401, "invalid x-api-key")


def slow(seconds: float, text: str = "too late") -> Behaviour:
    return Behaviour(kind="reply", text=text, delay=seconds)


def invalid_json() -> Behaviour:
    return Behaviour(kind="invalid_json")


def missing_fields() -> Behaviour:
    return Behaviour(kind="missing_fields")


def raw_json(body: Any) -> Behaviour:
    """A 200 whose JSON body is exactly `body` (for odd shapes: null content, empty choices...)."""
    return Behaviour(kind="raw", raw_body=json.dumps(body).encode())


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


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


def _openai_completion(text: str, body: dict[str, Any], counter: int) -> dict[str, Any]:
    prompt_tokens = max(1, len(json.dumps(body.get("messages", []))) // 4)
    completion_tokens = max(1, len(text) // 4)
    return {
        "id": f"chatcmpl-fake{counter}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "system_fingerprint": "fp_fake",
    }


def _anthropic_message(text: str, body: dict[str, Any], counter: int) -> dict[str, Any]:
    return {
        "id": f"msg_fake{counter}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake-model"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(1, len(json.dumps(body.get("messages", []))) // 4),
            "output_tokens": max(1, len(text) // 4),
        },
    }


class FakeProvider:
    """A threaded HTTP server on 127.0.0.1 (random port) that plays scripted provider replies."""

    def __init__(self, *, default: Behaviour | None = None) -> None:
        self.default = default or reply_text("fake summary")
        self.requests: list[RecordedRequest] = []
        self._script: list[Behaviour] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting -------------------------------------------------------------------------

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours, one per upcoming request."""
        with self._lock:
            self._script.extend(behaviours)

    def _next(self) -> Behaviour:
        with self._lock:
            return self._script.pop(0) if self._script else self.default

    def _record(self, request: RecordedRequest) -> int:
        with self._lock:
            self.requests.append(request)
            return len(self.requests)

    # -- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeProvider:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        # Handler threads are joined on close (block_on_close); delays wake on _closing, so
        # closing never waits for a slow reply nor leaves a thread behind.
        self._server.daemon_threads = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-provider",
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
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _make_handler(fake: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so no handler thread idles on a kept-alive socket.
        protocol_version = "HTTP/1.0"
        timeout = 5

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # keep pytest output clean

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            path = self.path.split("?", 1)[0]
            counter = fake._record(
                RecordedRequest(
                    method="POST",
                    path=path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
            )
            if path not in (OPENAI_PATH, ANTHROPIC_PATH, ANTHROPIC_COUNT_PATH):
                self._send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
                return
            behaviour = fake._next()
            if behaviour.delay and fake._closing.wait(behaviour.delay):
                return
            is_openai = path == OPENAI_PATH
            request_body = body if isinstance(body, dict) else {}
            headers = dict(behaviour.headers)
            if behaviour.kind == "reply" and path == ANTHROPIC_COUNT_PATH:
                self._send(200, {"input_tokens": fake_token_count(request_body)}, headers)
            elif behaviour.kind == "reply":
                build = _openai_completion if is_openai else _anthropic_message
                self._send(200, build(behaviour.text, request_body, counter), headers)
            elif behaviour.kind == "error":
                self._send(behaviour.status, _error_body(is_openai, behaviour), headers)
            elif behaviour.kind == "invalid_json":
                self._send_raw(200, b'{"id": "broken", "choices": [', headers)
            elif behaviour.kind == "missing_fields":
                shape = {"id": "x", "object": "chat.completion"} if is_openai else {"id": "x"}
                self._send(200, shape, headers)
            elif behaviour.kind == "raw":
                self._send_raw(200, behaviour.raw_body, headers)
            else:  # pragma: no cover - a typo in a test
                self._send(500, {"error": {"message": f"unknown behaviour {behaviour.kind}"}})

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            self._send_raw(status, json.dumps(payload).encode(), headers)

        def _send_raw(
            self, status: int, data: bytes, headers: dict[str, str] | None = None
        ) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout); nothing to answer

    return Handler


def fake_token_count(body: dict[str, Any]) -> int:
    """The count-tokens stand-in's answer: deterministic and additive, so tests can predict it.
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


def _error_body(is_openai: bool, behaviour: Behaviour) -> dict[str, Any]:
    if is_openai:
        return {
            "error": {
                "message": behaviour.message,
                "type": _ERROR_TYPES_OPENAI.get(behaviour.status, "server_error"),
                "param": None,
                "code": None,
            }
        }
    return {
        "type": "error",
        "error": {
            "type": _ERROR_TYPES_ANTHROPIC.get(behaviour.status, "api_error"),
            "message": behaviour.message,
        },
    }


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    """A running FakeProvider, closed after the test. Import it into a test module to use it."""
    with FakeProvider() as fake:
        yield fake
