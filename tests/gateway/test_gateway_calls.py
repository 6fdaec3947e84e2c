"""Every gateway call leaves a call row, whatever its outcome: a reply, the provider's error,
the gateway's own refusal, an upstream down or too slow, a client that went away, a failover;
with its latency, tokens, cost and fitting, and the reply's place in the ledger."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from compaction_app.testkit.provider_standin import Step
from sessions_app.calls import with_reply_seq
from sessions_app.models import Call, Event, Session
from sessions_app.services import session_create
from tests.support.gateway_live import anthropic_client, openai_client, token_for, wait_until
from tests.support.helpers import closed_port

pytestmark = pytest.mark.django_db(transaction=True)

HI = [{"role": "user", "content": "Hi"}]


def the_call(client_key: str) -> Call:
    """The session's one call, with its reply's seq (as the API reads it)."""
    wait_until(lambda: Call.objects.filter(session__client_key=client_key).exists())
    (call,) = with_reply_seq(Call.objects.filter(session__client_key=client_key))
    return call


def test_it_records_a_successful_call_with_its_usage_latency_cost_and_reply(
    gateway_url, upstream, alice
):
    upstream.script(Step(text="Hello.", prompt_tokens=40, cache_read_tokens=10))
    client = openai_client(gateway_url, key=token_for(alice), session="ok-call")
    client.chat.completions.create(model="gpt-4o", messages=HI)
    call = the_call("ok-call")
    assert call.status == "ok" and call.http_status == 200 and call.wire == "openai"
    assert call.model_requested == call.model_served == "gpt-4o"
    assert call.prompt_tokens == 40 and call.cached_input_tokens == 10
    assert call.completion_tokens and call.completion_tokens > 0
    assert call.cost_nano_usd and call.cost_nano_usd > 0
    assert call.ttfb_ms is not None and call.total_ms is not None
    assert 0 <= call.ttfb_ms <= call.total_ms
    assert call.attempts == [{"model": "gpt-4o", "outcome": "answered", "httpStatus": 200}]
    reply = Event.objects.get(session=call.session, type="AGENT_MESSAGE")
    assert call.reply_seq == reply.seq
    assert call.thread == reply.metadata["thread"]
    assert call.stream is False and call.fitted is False


def test_it_records_a_streamed_call_with_the_first_chunk_as_its_first_byte(
    gateway_url, upstream, alice
):
    upstream.script(Step(text="one two three four", pause=0.15, prompt_tokens=12))
    client = anthropic_client(gateway_url, key=token_for(alice), session="streamed-call")
    with client.messages.stream(model="claude-3.5-sonnet", max_tokens=50, messages=HI) as stream:
        "".join(stream.text_stream)
    call = the_call("streamed-call")
    assert call.status == "ok" and call.stream is True and call.wire == "anthropic"
    assert call.prompt_tokens == 12
    # Four chunks 0.15 s apart after the first: the end comes well after the first byte.
    assert call.ttfb_ms is not None and call.total_ms is not None
    assert call.total_ms - call.ttfb_ms >= 300
    assert call.reply_seq is not None


def test_it_records_the_providers_error(gateway_url, upstream, alice):
    upstream.script(Step(kind="error", status=400, message="bad temperature"))
    client = openai_client(gateway_url, key=token_for(alice), session="provider-error")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=HI)
    call = the_call("provider-error")
    assert call.status == "provider_error" and call.http_status == 400
    assert "bad temperature" in call.error
    assert call.reply_seq is None and call.prompt_tokens is None


def test_it_records_an_upstream_that_cannot_be_reached(gateway_url, upstream, alice, settings):
    settings.LEDGER_OPENAI_UPSTREAM = f"http://127.0.0.1:{closed_port()}/v1"
    client = openai_client(gateway_url, key=token_for(alice), session="upstream-down")
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert raised.value.status_code == 502
    call = the_call("upstream-down")
    assert call.status == "upstream_unavailable" and call.http_status == 502
    assert call.error_code == "upstream_unavailable"
    assert call.attempts == [{"model": "gpt-4o", "outcome": "upstream_unavailable"}]
    assert call.ttfb_ms is None and call.total_ms is not None


def test_it_records_a_timeout(gateway_url, upstream, alice, settings):
    settings.LEDGER_UPSTREAM_TIMEOUT_SECONDS = 0.3
    upstream.script(Step(delay=1.5))
    client = openai_client(gateway_url, key=token_for(alice), session="too-slow")
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="gpt-4o", messages=HI)
    call = the_call("too-slow")
    assert call.status == "timeout" and call.http_status == 502
    assert call.total_ms is not None and call.total_ms >= 300


def test_it_records_a_client_that_leaves_a_stream(gateway_url, upstream, alice):
    upstream.script(Step(text="one two three four five six", pause=0.4))
    body = {"model": "gpt-4o", "messages": HI, "stream": True}
    headers = {"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "leaver-call"}
    with (
        httpx.Client(timeout=10) as http,
        http.stream(
            "POST", f"{gateway_url}/gateway/openai/v1/chat/completions", json=body, headers=headers
        ) as response,
    ):
        seen = b""
        for chunk in response.iter_raw():
            seen += chunk
            if seen.count(b"data:") >= 2:
                break
    call = the_call("leaver-call")
    assert call.status == "client_disconnected" and call.stream is True
    # The part of the reply that came is in the ledger, marked incomplete.
    assert call.reply_seq is not None
    assert Event.objects.get(session=call.session, seq=call.reply_seq).metadata["incomplete"]


def test_it_records_a_client_that_leaves_before_the_answer(gateway_url, upstream, alice):
    upstream.script(Step(delay=2.0))
    client = openai_client(gateway_url, key=token_for(alice), session="impatient")
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).chat.completions.create(model="gpt-4o", messages=HI)
    call = the_call("impatient")
    assert call.status == "client_disconnected" and call.http_status is None


def test_it_records_every_model_a_failover_tried(gateway_url, upstream, alice):
    upstream.script(Step(kind="error", status=503))
    client = openai_client(
        gateway_url,
        key=token_for(alice),
        session="failover-call",
        **{"X-Ledger-Fallback-Models": "gpt-4o-mini"},
    )
    client.chat.completions.create(model="gpt-4o", messages=HI)
    call = the_call("failover-call")
    assert call.status == "ok"
    assert (call.model_requested, call.model_served) == ("gpt-4o", "gpt-4o-mini")
    assert call.attempts == [
        {"model": "gpt-4o", "outcome": "answered", "httpStatus": 503},
        {"model": "gpt-4o-mini", "outcome": "answered", "httpStatus": 200},
    ]
    assert call.failovers == 1


def test_it_records_the_gateways_refusal_in_the_session_it_names(gateway_url, upstream, alice):
    session = session_create(
        owner=alice, model="gpt-4o", context_limit=100, settings={"autoCompact": False}
    )
    client = anthropic_client(gateway_url, key=token_for(alice), session=str(session.pk))
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="gpt-4o", max_tokens=10, messages=[{"role": "user", "content": "long " * 300}]
        )
    (call,) = wait_until(lambda: list(Call.objects.filter(session=session)))
    assert call.status == "refused" and call.http_status == 400
    assert call.error_code == "context_length_exceeded"
    assert upstream.requests == []


def test_it_records_nothing_for_a_caller_without_a_valid_key(gateway_url, upstream, alice):
    from compaction_app.gateway.after import wait_idle

    client = openai_client(gateway_url, key="not-a-token", session="nobody")
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert wait_idle()
    assert not Call.objects.exists() and not Session.objects.exists()


# --- every call is a row, the first one of a new session key included ---------------------------


def test_it_records_a_first_call_naming_an_unknown_model_as_a_session_less_row(
    gateway_url, upstream, alice, alice_api, bob_api
):
    client = openai_client(gateway_url, key=token_for(alice), session="typo-first")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gtp-4o", messages=HI)
    assert refused.value.code == "unknown_model"
    (call,) = wait_until(lambda: list(Call.objects.filter(session_key="typo-first")))
    assert call.session_id is None and call.owner_id == alice.pk
    assert call.status == "refused" and call.http_status == 400
    assert (call.error_code, call.model_requested) == ("unknown_model", "gtp-4o")
    assert upstream.requests == []
    # Its owner sees it (and only its owner); it joins the session the key creates next.
    listed = alice_api.get("/api/v1/calls").json()["results"]
    assert [(c["sessionId"], c["sessionKey"], c["modelRequested"]) for c in listed] == [
        (None, "typo-first", "gtp-4o")
    ]
    assert bob_api.get("/api/v1/calls").json()["results"] == []
    client.chat.completions.create(model="gpt-4o", messages=HI)
    session = Session.objects.get(client_key="typo-first")
    wait_until(lambda: Call.objects.filter(session=session).count() == 2)
    statuses = sorted(session.calls.values_list("status", flat=True))
    assert statuses == ["ok", "refused"]
    usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    assert (usage["calls"], usage["failedCalls"]) == (1, 1)


def test_it_records_a_first_call_whose_body_is_not_json_with_the_model_it_names(
    gateway_url, upstream, alice, alice_api
):
    headers = {"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "bad-json-first"}
    response = httpx.post(
        f"{gateway_url}/gateway/openai/v1/chat/completions",
        content=b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}',
        headers={**headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    (call,) = wait_until(lambda: list(Call.objects.filter(session_key="bad-json-first")))
    assert (call.session_id, call.status, call.error_code) == (None, "refused", "malformed_json")
    assert call.model_requested == "gpt-4o"
    assert alice_api.get("/api/v1/calls").json()["summary"]["errors"] == 1


def test_it_names_the_model_of_a_refused_body(gateway_url, upstream, alice):
    client = anthropic_client(gateway_url, key=token_for(alice), session="refused-shape")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="claude-3.5-sonnet", max_tokens=10, messages=[])
    (call,) = wait_until(lambda: list(Call.objects.filter(session_key="refused-shape")))
    assert call.status == "refused" and call.model_requested == "claude-3.5-sonnet"


def test_it_records_a_call_without_a_session_header_for_its_owner(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session=None)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=HI)
    (call,) = wait_until(lambda: list(Call.objects.filter(owner=alice)))
    assert (call.session_id, call.session_key, call.error_code) == (None, "", "missing_session")
    assert call.model_requested == "gpt-4o"


# --- the bill counts every call the provider answered -----------------------------------------


def test_it_bills_a_repeated_request_as_the_provider_does(gateway_url, upstream, alice, alice_api):
    """The same request answered twice (a retry, create then stream): two calls the provider
    billed, one reply in the ledger; the session's bill and its calls agree."""
    upstream.script(
        Step(text="Same answer.", prompt_tokens=8), Step(text="Same answer.", prompt_tokens=8)
    )
    client = openai_client(gateway_url, key=token_for(alice), session="answered-twice")
    client.responses.create(model="gpt-4o", input="Hi")
    with client.responses.stream(model="gpt-4o", input="Hi") as stream:
        stream.get_final_response()
    session = Session.objects.get(client_key="answered-twice")
    wait_until(lambda: Call.objects.filter(session=session).count() == 2)
    assert Event.objects.filter(session=session, type="AGENT_MESSAGE").count() == 1
    usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    calls = alice_api.get(f"/api/v1/sessions/{session.pk}/calls").json()["summary"]
    assert usage["calls"] == calls["calls"] == 2
    assert usage["totalPromptTokens"] == calls["promptTokens"] == 16
    assert usage["totalCompletionTokens"] == calls["completionTokens"]
    assert usage["costUsd"] == pytest.approx(calls["costUsd"], abs=1e-9) and usage["costUsd"] > 0
    assert usage["reportedEventCount"] == 1  # the ledger holds the reply once


def test_it_keeps_the_usage_of_a_call_whose_client_left_while_its_reply_was_recorded(
    gateway_url, upstream, alice, alice_api, monkeypatch
):
    import time

    from compaction_app.gateway import thread_fit

    recording = thread_fit.record_thread_reply

    def slow_recording(**kwargs):
        time.sleep(1.0)  # the client gives up meanwhile
        return recording(**kwargs)

    monkeypatch.setattr(thread_fit, "record_thread_reply", slow_recording)
    upstream.script(Step(text="Recorded anyway.", prompt_tokens=8))
    client = openai_client(gateway_url, key=token_for(alice), session="left-while-recorded")
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).chat.completions.create(model="gpt-4o", messages=HI)
    session = wait_until(lambda: Session.objects.filter(client_key="left-while-recorded").first())
    wait_until(lambda: Session.objects.get(pk=session.pk).reported_event_count == 1)
    call = the_call("left-while-recorded")
    assert call.status == "client_disconnected"
    assert call.prompt_tokens == 8 and call.cost_nano_usd and call.cost_nano_usd > 0
    usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    assert usage["totalPromptTokens"] == call.prompt_tokens
    assert usage["totalCompletionTokens"] == call.completion_tokens
