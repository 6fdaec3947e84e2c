"""A streamed reply is bounded: an upstream that never stops streaming is cut past the size
or the duration limit with the provider's error event, and the ledger records what arrived,
marked incomplete (at most the bound)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from sessions_app.models import Event, EventType
from tests.support.gateway_live import CANARY, token_for

pytestmark = pytest.mark.django_db(transaction=True)

WORDS = "endless " * 64


class Endless(BaseHTTPRequestHandler):
    """An OpenAI-shaped upstream whose stream never ends (until the gateway hangs up)."""

    delay = 0.0

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {
            "id": "chatcmpl-endless",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "gpt-4o",
            "choices": [{"index": 0, "delta": {"content": WORDS}, "finish_reason": None}],
        }
        line = f"data: {json.dumps(chunk)}\n\n".encode()
        try:
            while True:
                self.wfile.write(line)
                self.wfile.flush()
                if self.delay:
                    time.sleep(self.delay)
        except (BrokenPipeError, ConnectionResetError):
            return


@pytest.fixture
def endless(settings) -> Iterator[type[Endless]]:
    handler = type("EndlessHandler", (Endless,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.LEDGER_OPENAI_UPSTREAM = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def _stream(gateway_url: str, key: str) -> tuple[str, float]:
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{gateway_url}/gateway/openai/v1/chat/completions",
        headers={
            "Authorization": f"Bearer {CANARY}",
            "X-Ledger-Key": key,
            "X-Ledger-Session": "endless",
        },
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "go"}]},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        text = "".join(response.iter_text())
    return text, time.monotonic() - started


def _reply() -> Event:
    deadline = time.monotonic() + 10
    while True:
        reply = Event.objects.filter(type=EventType.AGENT_MESSAGE).first()
        if reply is not None:
            return reply
        assert time.monotonic() < deadline, "the cut reply was not recorded"
        time.sleep(0.05)


def test_it_cuts_a_stream_past_the_size_limit(gateway_url, endless, alice, settings):
    settings.LEDGER_GATEWAY_STREAM_MAX_BYTES = 256 * 1024
    text, elapsed = _stream(gateway_url, token_for(alice))
    assert elapsed < 20
    last = [line for line in text.splitlines() if line.startswith("data: ")][-1]
    error = json.loads(last[len("data: ") :])["error"]
    assert "cut at 262144 bytes" in error["message"]
    assert len(text.encode()) < 256 * 1024 + 64 * 1024
    reply = _reply()
    assert reply.metadata["incomplete"] is True
    assert 0 < len(reply.content.encode()) <= 256 * 1024


def test_it_cuts_a_stream_past_the_duration_limit(gateway_url, endless, alice, settings):
    endless.delay = 0.05
    settings.LEDGER_GATEWAY_STREAM_MAX_SECONDS = 1.0
    text, elapsed = _stream(gateway_url, token_for(alice))
    assert elapsed < 10
    assert "cut after 1 s" in text
    assert _reply().metadata["incomplete"] is True
