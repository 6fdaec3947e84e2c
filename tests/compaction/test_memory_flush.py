"""The memory_flush hook: a signal before events are folded, and an async webhook POST."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from compaction_app.signals import memory_flush
from sessions_app.models import Event
from tests.support.helpers import (
    all_events,
    coding_turns,
    compact_and_wait,
    compaction_marker,
    grown_session,
)

pytestmark = pytest.mark.django_db(transaction=True)


class Webhook:
    """A local HTTP endpoint that records POSTed JSON, answers `statuses` in turn (then 200),
    and, when `hold` is set, keeps each request waiting until `release` is set."""

    def __init__(self, *, statuses: tuple[int, ...] = (), hold: bool = False) -> None:
        self.statuses = list(statuses)
        self.hold = hold
        self.bodies: list[Any] = []
        self.answered: list[int] = []
        self.received = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with webhook._lock:
                    webhook.bodies.append(body)
                    status = webhook.statuses.pop(0) if webhook.statuses else 200
                webhook.received.set()
                if webhook.hold:
                    webhook.release.wait(timeout=30)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                with webhook._lock:
                    webhook.answered.append(status)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/flush"

    def wait_for(self, predicate, *, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "webhook condition not met in time"
            time.sleep(0.02)

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def flush_calls() -> Iterator[list[dict[str, Any]]]:
    """Every memory_flush signal, with the folded state of its events as the receiver saw it."""
    calls: list[dict[str, Any]] = []

    def receiver(sender, *, session_id, run_id, events, **kwargs):
        calls.append(
            {
                "session_id": str(session_id),
                "run_id": str(run_id),
                "event_ids": [str(e.pk) for e in events],
                "compacted_by_in_db": list(
                    Event.objects.filter(pk__in=[e.pk for e in events]).values_list(
                        "compacted_by_id", flat=True
                    )
                ),
            }
        )

    memory_flush.connect(receiver, weak=False)
    yield calls
    memory_flush.disconnect(receiver)


def _grown_session(api) -> str:
    return grown_session(api, events=coding_turns(count=10))


def _folded_ids(api, session_id: str, run_id: str) -> list[str]:
    events = all_events(api, session_id=session_id)
    marker = compaction_marker(events, run_id=run_id)
    return [e["id"] for e in events if e["compactedBy"] == marker["id"]]


def test_it_sends_the_signal_with_the_events_before_they_are_folded(worker, alice_api, flush_calls):
    session_id = _grown_session(alice_api)
    run = compact_and_wait(alice_api, session_id=session_id, timeout=10)
    assert run["status"] == "completed"
    assert len(flush_calls) == 1
    call = flush_calls[0]
    assert call["session_id"] == session_id and call["run_id"] == run["id"]
    assert call["compacted_by_in_db"] and set(call["compacted_by_in_db"]) == {None}
    assert call["event_ids"] == _folded_ids(alice_api, session_id, run["id"])


def test_it_sends_no_signal_when_a_run_folds_nothing(worker, alice_api, flush_calls):
    session = alice_api.post(
        "/api/v1/sessions",
        {"model": "gpt-4o", "systemPrompt": "Be brief.", "settings": {"autoCompact": False}},
        format="json",
    ).json()
    alice_api.post(
        f"/api/v1/sessions/{session['id']}/events",
        {"type": "USER_MESSAGE", "content": "hello"},
        format="json",
    )
    run = compact_and_wait(alice_api, session_id=session["id"], timeout=10)
    assert run["status"] == "completed" and run["tokensAfter"] == run["tokensBefore"]
    assert flush_calls == []


def test_it_posts_the_folded_events_to_the_webhook(worker, alice_api, settings):
    with Webhook() as hook:
        settings.MEMORY_FLUSH_WEBHOOK_URL = hook.url
        session_id = _grown_session(alice_api)
        run = compact_and_wait(alice_api, session_id=session_id, timeout=10)
        assert run["status"] == "completed"
        hook.wait_for(lambda: hook.answered)
    assert len(hook.bodies) == 1
    body = hook.bodies[0]
    assert body["type"] == "memory_flush"
    assert body["compactionId"] == run["id"] and body["sessionId"] == session_id
    folded = _folded_ids(alice_api, session_id, run["id"])
    assert [e["id"] for e in body["events"]] == folded
    stored = {e["id"]: e for e in all_events(alice_api, session_id=session_id)}
    for event in body["events"]:
        assert event["content"] == stored[event["id"]]["content"]
        assert event["type"] == stored[event["id"]]["type"]


def test_it_retries_the_webhook_after_a_server_error(worker, alice_api, settings):
    settings.COMPACTION_RETRY_BACKOFF_SECONDS = 0.05
    with Webhook(statuses=(500, 503)) as hook:
        settings.MEMORY_FLUSH_WEBHOOK_URL = hook.url
        session_id = _grown_session(alice_api)
        run = compact_and_wait(alice_api, session_id=session_id, timeout=10)
        assert run["status"] == "completed"
        hook.wait_for(lambda: 200 in hook.answered)
    assert hook.answered == [500, 503, 200]
    assert hook.bodies[0] == hook.bodies[1] == hook.bodies[2]
    assert [e["id"] for e in hook.bodies[-1]["events"]] == _folded_ids(
        alice_api, session_id, run["id"]
    )


def test_it_completes_the_run_while_the_webhook_is_still_blocked(worker, alice_api, settings):
    settings.MEMORY_FLUSH_WEBHOOK_TIMEOUT_SECONDS = 30
    settings.SUMMARIZER_TIMEOUT_SECONDS = 30
    with Webhook(hold=True) as hook:
        settings.MEMORY_FLUSH_WEBHOOK_URL = hook.url
        session_id = _grown_session(alice_api)
        run = compact_and_wait(alice_api, session_id=session_id, timeout=10)
        assert run["status"] == "completed"
        usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
        assert usage["contextTokens"] == run["tokensAfter"]
        hook.wait_for(hook.received.is_set)
        assert hook.answered == []  # the webhook is still holding the request
        hook.release.set()
        hook.wait_for(lambda: hook.answered == [200])
