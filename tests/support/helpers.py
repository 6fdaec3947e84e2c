"""Helpers shared by the test modules: driving sessions and compaction runs through the REST
API, websocket connections, and the model-provider summarizer tests.

Django and Channels imports stay inside the functions so that the pure unit tests can import
this module under `-p no:django`.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from compaction_app.summarizers.base import SummarizerError
from compaction_app.testkit.provider_standin import ProviderStandIn, Step

SYSTEM_PROMPT = "You are a coding agent."
WS_ORIGIN = (b"origin", b"http://testserver")
FINISHED = ("completed", "failed")


# --- the ASGI application, driven as a server drives it ---------------------------------------


def asgi_http_scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The HTTP scope daphne hands config.asgi.application (host testserver, no query)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


def asgi_answer(sent: list[dict[str, Any]]) -> tuple[int, bytes]:
    """The status and the whole body of the response messages an application sent."""
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


# --- sessions and events through the REST API ------------------------------------------------


def create_session(
    api: Any, *, limit: int = 4000, system_prompt: str = SYSTEM_PROMPT, **settings: Any
) -> str:
    """Create a gpt-4o session and return its id. Auto-compaction is off unless `settings`
    (session settings, camelCase) turn it on."""
    response = api.post(
        "/api/v1/sessions",
        {
            "model": "gpt-4o",
            "contextLimit": limit,
            "systemPrompt": system_prompt,
            "settings": {"autoCompact": False, **settings},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def coding_turns(
    *,
    count: int,
    start: int = 0,
    numbered_results: bool = True,
    agent_note: str = "",
) -> list[dict[str, Any]]:
    """`count` turns of a coding agent (ask, read_file call, its result, reply), numbered from
    `start`. The options reproduce each test module's exact texts, hence token counts."""
    events: list[dict[str, Any]] = []
    for turn in range(start, start + count):
        if numbered_results:
            result = f"def f_{turn}():\n    return {turn}\n"
        else:
            result = "def f():\n    return 1\n"
        reply = f"Fixed bug {turn}: KeyError in handler_{turn}."
        events += [
            {"type": "USER_MESSAGE", "content": f"Please fix bug {turn} in src/module_{turn}.py"},
            {
                "type": "TOOL_CALL",
                "name": "read_file",
                "toolCallId": f"c{turn}",
                "content": f'{{"path": "src/module_{turn}.py"}}',
            },
            {
                "type": "TOOL_RESULT",
                "toolCallId": f"c{turn}",
                "name": "read_file",
                "content": result * 20,
            },
            {"type": "AGENT_MESSAGE", "content": f"{reply} {agent_note}" if agent_note else reply},
        ]
    return events


def append_events(api: Any, *, session_id: str, events: Any, expect: int = 201) -> Any:
    """POST one event or a list of them; assert the status code and return the body."""
    response = api.post(f"/api/v1/sessions/{session_id}/events", events, format="json")
    assert response.status_code == expect, response.json()
    return response.json()


def grown_session(
    api: Any, *, events: list[dict[str, Any]], limit: int = 4000, **settings: Any
) -> str:
    """A new session (see `create_session`) holding `events`; returns its id."""
    session_id = create_session(api, limit=limit, **settings)
    append_events(api, session_id=session_id, events=events)
    return session_id


def all_events(api: Any, *, session_id: str) -> list[dict[str, Any]]:
    """Every stored event of the session, folded ones included, in one page."""
    body = api.get(f"/api/v1/sessions/{session_id}/events?includeCompacted=true&limit=1000").json()
    assert body["nextAfter"] is None
    return body["results"]


# --- compaction runs ---------------------------------------------------------------------------


def request_compaction(api: Any, *, session_id: str, **body: Any) -> dict[str, Any]:
    """Ask for a compaction run (body fields as in the API); assert 202 and return the run."""
    response = api.post(f"/api/v1/sessions/{session_id}/compactions", body, format="json")
    assert response.status_code == 202, response.json()
    return response.json()


def wait_for_run(api: Any, *, run_id: str, timeout: float = 30) -> dict[str, Any]:
    """Poll the run until it has completed or failed; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        run = api.get(f"/api/v1/compactions/{run_id}").json()
        if run["status"] in FINISHED:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run['status']}"
        time.sleep(0.05)


def compact_and_wait(
    api: Any, *, session_id: str, timeout: float = 30, **body: Any
) -> dict[str, Any]:
    """Request a compaction run and return it once it has completed or failed."""
    run = request_compaction(api, session_id=session_id, **body)
    return wait_for_run(api, run_id=run["id"], timeout=timeout)


def compaction_marker(events: list[dict[str, Any]], *, run_id: str) -> dict[str, Any]:
    """The COMPACTION event the run `run_id` stored."""
    return next(
        e
        for e in events
        if e["type"] == "COMPACTION" and e["metadata"].get("compactionId") == run_id
    )


# --- model providers ---------------------------------------------------------------------------


@contextmanager
def fake_openai(settings: Any, *, default: Step | None = None) -> Iterator[ProviderStandIn]:
    """A running ProviderStandIn the OpenAI summarizer of the app is pointed at."""
    with ProviderStandIn(default=default) as fake:
        settings.OPENAI_BASE_URL = fake.openai_url
        settings.OPENAI_API_KEY = "test-key"
        yield fake


def rough_token_count(text: str) -> int:
    """A stand-in token counter (four characters a token) for summarizers under test."""
    return max(1, len(text) // 4)


def summarizer_error(call: Callable[[], object]) -> SummarizerError:
    """The SummarizerError `call` raises; the test fails if it raises none."""
    with pytest.raises(SummarizerError) as caught:
        call()
    return caught.value


def closed_port() -> int:
    """A local port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- websockets --------------------------------------------------------------------------------


def api_token(user: Any) -> str:
    """The user's REST token key (created when missing), as websocket clients send it."""
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=user)[0].key


def ws_communicator(path: str, *, token: str | None = None, cookie: str | None = None) -> Any:
    """A WebsocketCommunicator on the ASGI app with a same-site Origin, and the token (query
    string) or session cookie given."""
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    if token is not None:
        path = f"{path}?token={token}"
    headers = [WS_ORIGIN]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def receive_until(
    communicator: Any, *, wanted: str, session_id: str | None = None, timeout: float = 20
) -> dict[str, Any]:
    """The first message of type `wanted` (about `session_id`, when given), skipping others."""
    while True:
        message = await communicator.receive_json_from(timeout=timeout)
        if message["type"] == wanted and (
            session_id is None or message.get("sessionId") == session_id
        ):
            return message


def run_threads(count: int, work: Callable[[int], Any]) -> list[BaseException]:
    """`work(index)` in `count` threads released together (a barrier), each closing its own
    database connection; what they raised (the caller asserts on it)."""
    from django.db import connection

    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def target(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            work(index)
        except BaseException as exc:  # collected and re-raised by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return errors


def wait_listening(
    port: int, process: subprocess.Popen[str], *, what: str, seconds: float = 60.0
) -> None:
    """Until `process` accepts connections on `port`; an error naming `what` (with its
    stderr, when it was piped) if it exits first or does not listen within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read() if process.stderr else ""
            raise RuntimeError(f"{what} exited early: {stderr}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start listening")


def drain_output(process: subprocess.Popen[Any]) -> None:
    """Read a started server's piped output in the background for as long as it runs: its
    access log and request warnings would fill a pipe nobody reads (64 KB), and the server
    would stall on its next write."""

    def drain(stream: Any) -> None:
        for _line in stream:
            pass

    for stream in (process.stdout, process.stderr):
        if stream is not None:
            threading.Thread(target=drain, args=(stream,), name="drain", daemon=True).start()


def stop_process(process: subprocess.Popen[Any], *, seconds: float = 10.0) -> None:
    """Terminate `process`; kill it if it has not stopped within `seconds`."""
    process.terminate()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def least_traced_peak(call, *, limit: int, tries: int = 3):
    """(the least tracemalloc peak of up to `tries` calls of `call(attempt)`, the last call's
    result), stopping at the first peak within `limit`. tracemalloc counts every thread of the
    process, so a worker thread another test left busy can add to one call's figure."""
    import gc
    import tracemalloc

    peaks: list[int] = []
    result = None
    for attempt in range(tries):
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            result = call(attempt)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
        if peaks[-1] <= limit:
            break
    return min(peaks), result
