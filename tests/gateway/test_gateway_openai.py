"""The gateway's OpenAI Chat Completions endpoint, driven by the official `openai` SDK against
daphne serving the app, forwarding to the provider stand-in."""

from __future__ import annotations

import json

import openai
import pytest

from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Event, Session
from tests.support.gateway_live import CANARY, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are a terse coding agent."}


def events_of(session_id: str) -> list[Event]:
    return list(Event.objects.filter(session_id=session_id).order_by("seq"))


def test_it_records_a_conversation_and_forwards_only_whats_needed(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="thread-1")
    history = [SYSTEM, {"role": "user", "content": "List the files."}]
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    completion = raw.parse()
    assert completion.choices[0].message.content == "Hello from the stand-in."
    session = Session.objects.get(owner=alice, client_key="thread-1")
    assert raw.headers["X-Ledger-Session"] == str(session.pk)
    assert raw.headers["X-Ledger-Model"] == "gpt-4o"
    assert raw.headers["X-Ledger-Compacted"] == "false"
    assert int(raw.headers["X-Ledger-Context-Tokens"]) > 0
    assert float(raw.headers["X-Ledger-Percent-Used"]) >= 0
    # The upstream got the client's own body and its credential.
    sent = upstream.requests[-1]
    assert sent.body["messages"] == history
    assert sent.headers["authorization"] == f"Bearer {CANARY}"
    assert not any(name.startswith("x-ledger") for name in sent.headers)

    stored = events_of(str(session.pk))
    assert [e.type for e in stored] == ["SYSTEM_PROMPT", "USER_MESSAGE", "AGENT_MESSAGE"]
    reply = stored[-1]
    assert reply.content == "Hello from the stand-in."
    assert reply.metadata["model"] == "gpt-4o"
    assert reply.prompt_tokens == completion.usage.prompt_tokens
    assert reply.completion_tokens == completion.usage.completion_tokens

    # The next call resends the whole history: only the new user message is appended.
    history += [
        {"role": "assistant", "content": completion.choices[0].message.content},
        {"role": "user", "content": "Now fix the test."},
    ]
    client.chat.completions.create(model="gpt-4o", messages=history)
    stored = events_of(str(session.pk))
    assert [e.type for e in stored] == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "AGENT_MESSAGE",
        "USER_MESSAGE",
        "AGENT_MESSAGE",
    ]
    assert all(e.message_hash for e in stored)


def test_it_records_nothing_twice_on_a_retry(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="retry-thread")
    history = [SYSTEM, {"role": "user", "content": "Hi"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    client.chat.completions.create(model="gpt-4o", messages=history)  # the same request again
    session = Session.objects.get(client_key="retry-thread")
    types = [e.type for e in events_of(str(session.pk))]
    # The request's messages once; the retried request's identical reply once.
    assert types == ["SYSTEM_PROMPT", "USER_MESSAGE", "AGENT_MESSAGE"]


def test_it_records_tool_calls_and_results(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="tools")
    upstream.script(Step(text="", tool_calls=(("call_1", "read_file", '{"path": "a.py"}'),)))
    history = [SYSTEM, {"role": "user", "content": "Read a.py"}]
    first = client.chat.completions.create(
        model="gpt-4o",
        messages=history,
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
    )
    call = first.choices[0].message
    history += [
        call.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_1", "content": "print('a')"},
    ]
    client.chat.completions.create(model="gpt-4o", messages=history)
    session = Session.objects.get(client_key="tools")
    stored = events_of(str(session.pk))
    assert [e.type for e in stored] == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "TOOL_CALL",
        "TOOL_RESULT",
        "AGENT_MESSAGE",
    ]
    assert stored[2].name == "read_file"
    assert stored[2].tool_call_id == "call_1"
    assert json.loads(stored[2].content) == {"path": "a.py"}
    # The tools field the gateway does not know reached the upstream unchanged.
    assert upstream.requests[0].body["tools"][0]["function"]["name"] == "read_file"


def test_it_passes_unknown_fields_through(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="passthrough")
    client.chat.completions.create(
        model="gpt-4o",
        messages=[SYSTEM, {"role": "user", "content": "Hi"}],
        temperature=0.25,
        extra_body={"vendor_knob": {"x": [1, 2]}},
    )
    body = upstream.requests[-1].body
    assert body["temperature"] == 0.25
    assert body["vendor_knob"] == {"x": [1, 2]}


def test_it_uses_an_existing_session_by_id_and_isolates_users(gateway_url, upstream, alice, bob):
    from sessions_app.services import session_create

    mine = session_create(
        owner=alice, model="gpt-4o", system_prompt="You are a terse coding agent."
    )
    client = openai_client(gateway_url, key=token_for(alice), session=str(mine.pk))
    client.chat.completions.create(
        model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "Hi"}]
    )
    # The system prompt stored at creation is recognised, not stored twice.
    assert [e.type for e in events_of(str(mine.pk))] == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "AGENT_MESSAGE",
    ]

    intruder = openai_client(gateway_url, key=token_for(bob), session=str(mine.pk))
    with pytest.raises(openai.NotFoundError) as caught:
        intruder.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["type"] == "not_found_error"
    assert len(events_of(str(mine.pk))) == 3
    # Bob's own key makes his own session, not Alice's.
    openai_client(gateway_url, key=token_for(bob), session="thread-1").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}]
    )
    assert Session.objects.get(owner=bob, client_key="thread-1")


def test_it_refuses_a_missing_or_wrong_key_in_openais_shape(gateway_url, upstream, alice):
    for key in (None, "not-a-token"):
        client = openai_client(gateway_url, key=key, session="t")
        with pytest.raises(openai.AuthenticationError) as caught:
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "x"}]
            )
        assert caught.value.status_code == 401
        assert caught.value.body["type"] == "authentication_error"
    assert upstream.requests == []
    assert not Session.objects.exists()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "gpt-4o", "messages": "hi"}, "messages"),
        ({"model": "gpt-4o", "messages": []}, "messages"),
        ({"model": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "gpt-4o", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        # The first message that fails is named, past valid ones (the check's fast path
        # hands over to the loop that finds it).
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}, "hi"]}, "messages[1]"),
        (
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}, {"content": "y"}]},
            "messages[1].role",
        ),
        (
            {
                "model": "gpt-4o",
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y"},
                    {"role": ["user"], "content": "z"},
                ],
            },
            "messages[2].role",
        ),
        ({"model": "gpt-4o", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
            "stream",
        ),
        (
            {"model": "gpt-4o", "messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
    ],
)
def test_it_answers_bad_input_with_a_400_in_openais_shape(
    gateway_url, upstream, alice, body, param
):
    import httpx

    response = httpx.post(
        f"{gateway_url}/gateway/openai/v1/chat/completions",
        json=body,
        headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "bad"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert upstream.requests == []
    assert not Event.objects.exists()


def test_it_answers_malformed_json_with_a_400(gateway_url, upstream, alice):
    import httpx

    response = httpx.post(
        f"{gateway_url}/gateway/openai/v1/chat/completions",
        content=b'{"model": "gpt-4o", "messages": [',
        headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "bad"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"


@pytest.mark.parametrize("depth", [80, 100_000])
def test_it_answers_json_nested_too_deep_with_a_400(gateway_url, upstream, alice, depth):
    import httpx

    nested = "[" * depth + "]" * depth
    body = (
        '{"model": "gpt-4o", "messages": [{"role": "user", "content": "x", "extra": '
        + nested
        + "}]}"
    )
    response = httpx.post(
        f"{gateway_url}/gateway/openai/v1/chat/completions",
        content=body.encode(),
        headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "deep"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "nesting_too_deep"
    assert upstream.requests == []
    assert not Event.objects.exists()


def test_it_refuses_an_unknown_model_without_a_session(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="new-thread")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="no-such-model-xyz", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["code"] == "unknown_model"
    assert not Session.objects.exists()
    assert upstream.requests == []


def test_it_returns_upstream_errors_with_their_status_and_body(gateway_url, upstream, alice):
    upstream.script(Step(kind="error", status=400, message="bad temperature"))
    client = openai_client(gateway_url, key=token_for(alice), session="errs")
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["message"] == "bad temperature"
    assert caught.value.response.headers["X-Ledger-Model"] == "gpt-4o"


def test_it_lists_models_in_openais_shape(gateway_url, alice):
    client = openai_client(gateway_url, key=token_for(alice), session=None)
    models = {model.id: model for model in client.models.list()}
    assert "gpt-4o" in models
    assert models["gpt-4o"].object == "model"
    with pytest.raises(openai.AuthenticationError):
        openai_client(gateway_url, key="wrong", session=None).models.list()


def test_it_forwards_the_clients_headers_and_says_json_when_the_client_did_not(
    gateway_url, upstream, alice
):
    import httpx

    body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]})
    response = httpx.post(
        f"{gateway_url}/gateway/openai/v1/chat/completions",
        content=body.encode(),
        headers={
            "X-Ledger-Key": token_for(alice),
            "X-Ledger-Session": "no-content-type",
            "Authorization": f"Bearer {CANARY}",
            "User-Agent": "my-agent/1.0",
            "OpenAI-Organization": "org-123",
        },
    )
    assert response.status_code == 200, response.text
    sent = upstream.requests[-1]
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["user-agent"] == "my-agent/1.0"
    assert sent.headers["openai-organization"] == "org-123"
    assert sent.headers["accept-encoding"] == "identity"
    assert not any(name.startswith("x-ledger-") for name in sent.headers)
