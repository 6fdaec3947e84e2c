"""Model-provider summarizers through real runs: a local server speaks the OpenAI and Anthropic
wire formats; the Celery worker retries transient failures and fails permanent ones at once."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_app.testkit.provider_standin import (
    ProviderStandIn,
    overloaded,
    rate_limited,
    reply_text,
    server_error,
    unauthorized,
)
from tests.support.helpers import all_events, coding_turns, compact_and_wait, grown_session

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(settings):
    """A ProviderStandIn both SDKs are pointed at, with fast task retries."""
    settings.COMPACTION_RETRY_BACKOFF_SECONDS = 0.02
    settings.SUMMARIZER_TIMEOUT_SECONDS = 5
    with ProviderStandIn() as fake:
        settings.OPENAI_BASE_URL = fake.openai_url
        settings.OPENAI_API_KEY = "sk-test-openai"
        settings.OPENAI_SUMMARY_MODEL = "gpt-4o-mini"
        settings.ANTHROPIC_BASE_URL = fake.anthropic_url
        settings.ANTHROPIC_API_KEY = "sk-ant-test"
        settings.ANTHROPIC_SUMMARY_MODEL = "claude-haiku-4-5"
        yield fake


def _grown_session(api, *, summarizer: str) -> str:
    return grown_session(api, events=coding_turns(count=10), summarizer=summarizer)


def _state(api, session_id: str) -> dict[str, Any]:
    usage = api.get(f"/api/v1/sessions/{session_id}/usage").json()
    usage.pop("lastCompaction")
    return {
        "events": api.get(
            f"/api/v1/sessions/{session_id}/events?includeCompacted=true&limit=1000"
        ).json(),
        "usage": usage,
        "context": api.get(f"/api/v1/sessions/{session_id}/context").json(),
        "summary": api.get(f"/api/v1/sessions/{session_id}/summary").status_code,
    }


def _assert_failed_cleanly(api, session_id: str, run: dict[str, Any], before, fake) -> None:
    assert run["status"] == "failed", run
    assert run["tokensAfter"] is None and run["finishedAt"]
    assert _state(api, session_id) == before  # events, counters, context: untouched
    assert api.get(f"/api/v1/sessions/{session_id}/summary").status_code == 404
    events = before["events"]["results"]
    assert not any(e["type"] == "COMPACTION" for e in events)
    assert fake.requests  # the provider was really asked
    usage = api.get(f"/api/v1/sessions/{session_id}/usage").json()
    assert usage["lastCompaction"]["id"] == run["id"]
    assert usage["lastCompaction"]["status"] == "failed"


# --- OpenAI ---------------------------------------------------------------------------------


def test_it_stores_the_openai_providers_text_as_the_summary(worker, alice_api, provider):
    provider.script(reply_text("## Status\n- Bugs 0-9 fixed with dict lookups."))
    session_id = _grown_session(alice_api, summarizer="openai")
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed", run
    assert run["summarizer"] == "openai"
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert summary["summary"] == "## Status\n- Bugs 0-9 fixed with dict lookups."
    assert len(provider.requests) == 1
    request = provider.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "gpt-4o-mini"
    assert request.headers["authorization"] == "Bearer sk-test-openai"
    assert "Fixed bug 0" in request.body["messages"][-1]["content"]
    context = alice_api.get(f"/api/v1/sessions/{session_id}/context").json()
    assert context["summary"] == summary["summary"]


def test_it_retries_a_transient_openai_error_and_then_succeeds(worker, alice_api, provider):
    provider.script(server_error(500), rate_limited(retry_after=1), reply_text("recovered"))
    session_id = _grown_session(alice_api, summarizer="openai")
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "completed", run
    assert len(provider.requests) == 3
    assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()["summary"] == (
        "recovered"
    )
    events = all_events(alice_api, session_id=session_id)
    assert [e["type"] for e in events].count("COMPACTION") == 1


@pytest.mark.parametrize("failure", [server_error(500), rate_limited(retry_after=1)])
def test_it_fails_the_run_cleanly_when_openai_keeps_failing(worker, alice_api, provider, failure):
    provider.default = failure
    session_id = _grown_session(alice_api, summarizer="openai")
    before = _state(alice_api, session_id)
    run = compact_and_wait(alice_api, session_id=session_id)
    _assert_failed_cleanly(alice_api, session_id, run, before, provider)
    assert len(provider.requests) == 4  # the first attempt and three retries
    status = "500" if failure.status == 500 else "429"
    assert run["error"].startswith(f"openai summarizer failed: openai: HTTP {status}")
    assert "sk-test-openai" not in run["error"]


def test_it_fails_at_once_on_a_permanent_openai_error(worker, alice_api, provider):
    provider.default = unauthorized()
    session_id = _grown_session(alice_api, summarizer="openai")
    before = _state(alice_api, session_id)
    run = compact_and_wait(alice_api, session_id=session_id)
    _assert_failed_cleanly(alice_api, session_id, run, before, provider)
    assert len(provider.requests) == 1
    assert "HTTP 401" in run["error"]


def test_it_fails_cleanly_when_no_openai_key_or_endpoint_is_configured(worker, alice_api, settings):
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    session_id = _grown_session(alice_api, summarizer="openai")
    run = compact_and_wait(alice_api, session_id=session_id)
    assert run["status"] == "failed"
    assert "no API key configured" in run["error"]
    assert alice_api.get(f"/api/v1/sessions/{session_id}/summary").status_code == 404


# --- Anthropic ------------------------------------------------------------------------------


def test_it_stores_the_anthropic_providers_text_as_the_summary(worker, alice_api, provider):
    provider.script(overloaded(), reply_text("## Status\n- Claude summary."))
    session_id = _grown_session(alice_api, summarizer="anthropic")
    run = compact_and_wait(alice_api, session_id=session_id, summarizer="anthropic")
    assert run["status"] == "completed", run
    assert len(provider.requests) == 2  # the 529 was retried
    assert all(r.path == "/v1/messages" for r in provider.requests)
    headers = provider.requests[-1].headers
    # The SDK sends the key as x-api-key or, in recent versions, as a bearer token.
    assert "sk-ant-test" in (headers.get("x-api-key", ""), headers.get("authorization", "")[7:])
    assert provider.requests[-1].body["model"] == "claude-haiku-4-5"
    summary = alice_api.get(f"/api/v1/sessions/{session_id}/summary").json()
    assert summary["summary"] == "## Status\n- Claude summary."


def test_it_fails_at_once_on_a_permanent_anthropic_error(worker, alice_api, provider):
    provider.default = unauthorized()
    session_id = _grown_session(alice_api, summarizer="local")
    before = _state(alice_api, session_id)
    run = compact_and_wait(alice_api, session_id=session_id, summarizer="anthropic")
    _assert_failed_cleanly(alice_api, session_id, run, before, provider)
    assert len(provider.requests) == 1
    assert run["summarizer"] == "anthropic"
    assert run["error"].startswith("anthropic summarizer failed: anthropic: HTTP 401")
