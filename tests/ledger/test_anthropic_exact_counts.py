"""Anthropic's count-tokens API as the exact counter of Claude sessions: the official SDK
against a local stand-in (tests/provider_standin.py) over real HTTP, with a real Celery worker
thread replacing the local counts after the append answered."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.management import call_command

from compaction_app.realtime.broadcast import session_group
from compaction_app.testkit.provider_standin import (
    ANTHROPIC_COUNT_PATH,
    fake_token_count,
    invalid_json,
    missing_fields,
    rate_limited,
    server_error,
    slow,
)
from sessions_app.anthropic_counter import LedgerMessage, to_anthropic_messages
from sessions_app.models import Event, Session, TokenProvenance

SYSTEM = "You are Claude, a careful coding agent."
TURNS = [
    {"type": "USER_MESSAGE", "content": "Please fix the failing test in src/app.py, error E42."},
    {"type": "AGENT_MESSAGE", "content": "Looking at src/app.py now."},
    {
        "type": "TOOL_CALL",
        "name": "read_file",
        "toolCallId": "c1",
        "content": '{"path": "src/app.py"}',
    },
    {
        "type": "TOOL_RESULT",
        "name": "read_file",
        "toolCallId": "c1",
        "content": "def f():\n    return 41\n",
    },
    {"type": "AGENT_MESSAGE", "content": "Fixed: f() now returns 42; tests pass."},
]


@pytest.fixture
def counting(settings, fake):
    settings.ANTHROPIC_API_KEY = "sk-ant-test"
    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = True
    settings.LEDGER_ANTHROPIC_UPSTREAM = fake.anthropic_url
    settings.LEDGER_ANTHROPIC_COUNT_TIMEOUT_SECONDS = 0.5
    settings.LEDGER_ANTHROPIC_COUNT_MAX_RETRIES = 2
    settings.LEDGER_ANTHROPIC_COUNT_BACKOFF_SECONDS = 0.05
    return fake


def claude_session(api, *, turns=TURNS, before_append=None, on_created=None) -> str:
    response = api.post(
        "/api/v1/sessions",
        {"model": "claude-3.5-sonnet", "systemPrompt": SYSTEM, "settings": {"autoCompact": False}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    session_id = response.json()["id"]
    if on_created is not None:
        on_created(session_id)
    if before_append is not None:
        before_append()
    response = api.post(f"/api/v1/sessions/{session_id}/events", turns, format="json")
    assert response.status_code == 201, response.json()
    return session_id


def wait_until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def all_exact(session_id: str) -> bool:
    events = Event.objects.filter(session_id=session_id)
    return all(e.token_provenance == TokenProvenance.ANTHROPIC_API for e in events)


def whole_request_count() -> int:
    messages = [
        LedgerMessage(t["type"], t["content"], t.get("name", ""), t.get("toolCallId", ""))
        for t in TURNS
    ]
    return fake_token_count({"system": SYSTEM, "messages": to_anthropic_messages(messages)})


def count_requests(fake) -> int:
    return sum(1 for r in fake.requests if r.path == ANTHROPIC_COUNT_PATH)


def test_it_stores_the_local_count_at_once_and_the_apis_exact_count_after(
    counting, worker, alice_api, settings
):
    counting.script(slow(0.3))  # the first count call is slow: the append does not wait
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()

    def subscribe_and_switch_on() -> None:
        async_to_sync(layer.group_add)(session_group(session_ids[0]), channel)
        settings.LEDGER_ANTHROPIC_COUNT_TOKENS = True

    session_ids: list[str] = []
    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = False
    started = time.monotonic()
    session_id = claude_session(
        alice_api, before_append=subscribe_and_switch_on, on_created=session_ids.append
    )
    assert time.monotonic() - started < 5
    local = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert local["exact"] is False
    assert all(
        e.token_provenance == TokenProvenance.LOCAL
        for e in Event.objects.filter(session_id=session_id)
    )

    wait_until(lambda: all_exact(session_id))
    events = list(Event.objects.filter(session_id=session_id).order_by("seq"))
    # Each message's cost is the count with it minus the count without it, so the stored
    # numbers add up to the whole request's count.
    assert sum(e.token_count for e in events) == whole_request_count()
    assert all(e.exact_token_count == e.token_count for e in events)
    assert events[-1].exact_cumulative_count == whole_request_count()
    usage = alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert usage["exact"] is True
    listed = alice_api.get(f"/api/v1/sessions/{session_id}/events").json()["results"]
    assert {e["tokenProvenance"] for e in listed} == {"anthropic-api"}
    assert usage["contextTokens"] == whole_request_count() + 3  # plus the reply primer
    assert usage["contextTokens"] != local["contextTokens"]
    session = Session.objects.get(pk=session_id)
    assert session.ledger_tokens == whole_request_count()
    # The SDK really went over HTTP with the key, the model and the system prompt.
    request = next(
        r for r in counting.requests if r.path == ANTHROPIC_COUNT_PATH and r.body.get("system")
    )
    assert "sk-ant-test" in str(request.headers), request.headers
    assert request.body["model"] == "claude-3.5-sonnet"

    async def usage_updates() -> list[dict]:
        seen: list[dict] = []
        while not (seen and seen[-1]["usage"]["exact"]):
            message = (await asyncio.wait_for(layer.receive(channel), 10))["message"]
            if message["type"] == "USAGE_UPDATED":
                seen.append(message)
        return seen

    updates = async_to_sync(usage_updates)()
    assert updates[-1]["usage"]["contextTokens"] == whole_request_count() + 3


def test_it_caches_the_system_prompt_count_by_its_content(counting, worker, alice_api):
    first = claude_session(alice_api)
    wait_until(lambda: all_exact(first))
    calls = count_requests(counting)
    second = claude_session(alice_api)
    wait_until(lambda: all_exact(second))
    # Second session: one call per message, none for the (same) system prompt.
    assert count_requests(counting) - calls == len(TURNS)


@pytest.mark.parametrize(
    "failure",
    [rate_limited(retry_after=1), server_error(500), slow(2.0)],
    ids=["429-retry-after", "500", "timeout"],
)
def test_it_retries_rate_limits_outages_and_timeouts(
    counting, worker, alice_api, settings, failure
):
    counting.script(failure)

    def switch_on() -> None:
        settings.LEDGER_ANTHROPIC_COUNT_TOKENS = True

    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = False  # one task: the turns' append
    started = time.monotonic()
    session_id = claude_session(alice_api, before_append=switch_on)
    wait_until(lambda: all_exact(session_id))
    assert (
        sum(e.token_count for e in Event.objects.filter(session_id=session_id))
        == whole_request_count()
    )
    if failure.status == 429:
        assert time.monotonic() - started >= 1.0  # retry-after was honoured
    assert alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()["exact"] is True


@pytest.mark.parametrize(
    "failure",
    [invalid_json(), missing_fields(), server_error(503)],
    ids=["malformed-json", "missing-input-tokens", "outage-past-the-retries"],
)
def test_it_keeps_the_local_count_with_one_warning_when_counting_fails(
    counting, worker, alice_api, caplog, settings, failure
):
    counting.default = failure  # every call fails the same way

    def switch_on() -> None:
        settings.LEDGER_ANTHROPIC_COUNT_TOKENS = True

    # Counting starts with the turns' append: one task, so one give-up.
    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = False
    with caplog.at_level(logging.WARNING, logger="sessions_app"):
        session_id = claude_session(alice_api, before_append=switch_on)
        local = {e.pk: e.token_count for e in Event.objects.filter(session_id=session_id)}
        wait_until(lambda: any("gave up" in r.getMessage() for r in caplog.records))
    time.sleep(0.5)  # room for a (wrong) second warning
    warnings = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "sessions_app" in r.name
    ]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    if failure.status == 503:  # transient: retried up to the limit first
        assert count_requests(counting) == 1 + settings.LEDGER_ANTHROPIC_COUNT_MAX_RETRIES
    else:  # permanent: not retried
        assert count_requests(counting) == 1
    events = Event.objects.filter(session_id=session_id)
    assert {e.pk: e.token_count for e in events} == local
    assert all(e.token_provenance == TokenProvenance.LOCAL for e in events)
    assert alice_api.get(f"/api/v1/sessions/{session_id}/usage").json()["exact"] is False


def test_it_leaves_other_models_and_a_disabled_switch_alone(counting, worker, alice_api, settings):
    response = alice_api.post(
        "/api/v1/sessions", {"model": "gpt-4o", "systemPrompt": SYSTEM}, format="json"
    )
    alice_api.post(f"/api/v1/sessions/{response.json()['id']}/events", TURNS, format="json")
    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = False
    claude_session(alice_api)
    time.sleep(0.5)
    assert count_requests(counting) == 0


def test_it_recounts_existing_claude_sessions_with_a_progress_bar(
    counting, settings, alice_api, capsys
):
    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = False  # recorded before counting was switched on
    session_id = claude_session(alice_api)
    assert not all_exact(session_id)
    settings.LEDGER_ANTHROPIC_COUNT_TOKENS = True
    call_command("recount_claude_tokens")
    out, err = capsys.readouterr()
    assert "Claude sessions" in err and "100%" in err
    assert f"{len(TURNS) + 1} events counted exactly" in out
    assert all_exact(session_id)
    assert (
        sum(e.token_count for e in Event.objects.filter(session_id=session_id))
        == whole_request_count()
    )
