"""The fit ladder and failover in the call path: transparent compaction, prune between the
thresholds, summarize at the hard limit (CONTEXT_COMPRESSED), 400 when nothing fits,
`X-Ledger-Fit: off`, fallback models fitted to their own windows."""

from __future__ import annotations

import logging

import openai
import pytest
from asgiref.sync import async_to_sync, sync_to_async

from compaction_app.models import CompactionRun
from compaction_app.services import compaction_run_sync
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Event, Session
from sessions_app.services import session_update
from tests.support.gateway_live import openai_client, token_for
from tests.support.helpers import receive_until, ws_communicator

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are a coding agent."}
REPLY = "Hello from the stand-in."


def converse(client, turns: int, *, start: int = 0, history=None) -> list[dict]:
    """`turns` calls through the gateway; returns the history the client holds."""
    history = list(history or [SYSTEM])
    for turn in range(start, start + turns):
        history.append(
            {
                "role": "user",
                "content": f"Please look at src/module_{turn}.py and fix bug {turn}. " * 12,
            }
        )
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    return history


def quiet(session: Session, **settings) -> Session:
    return session_update(session=session, settings={"autoCompact": False, **settings})


def test_it_forwards_the_active_context_once_the_session_was_compacted(
    gateway_url, upstream, alice
):
    client = openai_client(gateway_url, key=token_for(alice), session="compacted")
    history = converse(client, 6)
    session = quiet(Session.objects.get(client_key="compacted"), keepRecentEvents=1)
    run = compaction_run_sync(session=session, user=None)
    assert run.status == "completed" and run.folded_count > 0

    history.append({"role": "user", "content": "And now?"})
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    assert raw.headers["X-Ledger-Compacted"] == "true"
    sent = upstream.requests[-1].body["messages"]
    # The client resent everything; the model got the summary and what was kept.
    assert len(sent) < len(history)
    assert sent[0]["content"] == SYSTEM["content"]
    assert sent[1]["role"] == "system" and sent[1]["content"] != SYSTEM["content"]
    assert sent[-1] == {"role": "user", "content": "And now?"}
    # Only the one new message was recorded (plus the reply).
    assert Event.objects.filter(session=session, content="And now?").count() == 1


def test_it_prunes_between_the_thresholds_and_logs_it(gateway_url, upstream, alice, caplog):
    client = openai_client(gateway_url, key=token_for(alice), session="prune")
    history = converse(client, 6)
    # Pruning is the last resort: here no compaction can run (no tool results to clear).
    session = quiet(Session.objects.get(client_key="prune"), strategy="clear_tool_results")
    session_update(session=session, context_limit=int((session.context_tokens + 12) / 0.88))
    history.append({"role": "user", "content": "Status?"})
    with caplog.at_level(logging.INFO, logger="context"):
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    sent = upstream.requests[-1].body["messages"]
    assert len(sent) < len(history)
    assert sent[0] == SYSTEM and sent[-1]["content"] == "Status?"
    assert raw.headers["X-Ledger-Compacted"] == "true"
    assert int(raw.headers["X-Ledger-Context-Tokens"]) < session.context_tokens
    assert any("context_window_approaching" in r.getMessage() for r in caplog.records)
    assert not CompactionRun.objects.filter(session=session).exists()


def test_it_summarizes_at_the_hard_limit_and_announces_it(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="hard")
    history = converse(client, 6)
    session = quiet(Session.objects.get(client_key="hard"), keepRecentEvents=1)
    session_update(session=session, context_limit=int((session.context_tokens + 12) / 0.97))
    history.append({"role": "user", "content": "Status?"})

    key = token_for(alice)

    async def scenario():
        # The session's own websocket, as an API client watching it would listen.
        socket = ws_communicator(f"/ws/sessions/{session.pk}/", token=key)
        connected, _ = await socket.connect()
        assert connected
        raw = await sync_to_async(
            client.chat.completions.with_raw_response.create, thread_sensitive=False
        )(model="gpt-4o", messages=history)
        message = await receive_until(socket, wanted="CONTEXT_COMPRESSED")
        await socket.disconnect()
        return raw, message

    raw, message = async_to_sync(scenario)()
    run = CompactionRun.objects.get(session=session)
    assert run.trigger == "gateway" and run.status == "completed"
    assert raw.headers["X-Ledger-Compacted"] == "true"
    assert message == {
        "type": "CONTEXT_COMPRESSED",
        "sessionId": str(session.pk),
        "originalTokenCount": run.tokens_before,
        "compressedTokenCount": run.tokens_after,
    }
    assert upstream.requests[-1].body["messages"][-1]["content"] == "Status?"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{n}",
            "description": "Reads a file of the repository and returns its lines. " * 4,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for n in range(4)
]


def test_it_counts_tool_definitions_in_the_window(gateway_url, upstream, alice):
    from sessions_app.tokens import non_text_tokens

    definitions = non_text_tokens(TOOLS)
    client = openai_client(gateway_url, key=token_for(alice), session="tools-window")
    history = converse(client, 6)
    session = quiet(Session.objects.get(client_key="tools-window"))
    # The messages alone use 70 % of the window; with the tools they pass the 80 % threshold.
    limit = int((session.context_tokens + 12) / 0.7)
    assert (session.context_tokens + 12) / (limit - definitions) > 0.8
    session_update(session=session, context_limit=limit)

    history.append({"role": "user", "content": "Status?"})
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    assert upstream.requests[-1].body["messages"] == history  # no tools: forwarded as sent
    without = int(raw.headers["X-Ledger-Context-Tokens"])

    history += [{"role": "assistant", "content": REPLY}, {"role": "user", "content": "Again?"}]
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=history, tools=TOOLS
    )
    sent = upstream.requests[-1].body
    assert len(sent["messages"]) < len(history)  # pruned to leave the tools their room
    assert sent["tools"] == TOOLS
    assert sent["messages"][-1]["content"] == "Again?"
    counted = int(raw.headers["X-Ledger-Context-Tokens"])
    assert counted <= limit * 0.8 + definitions
    assert counted > definitions
    assert counted != without


def test_it_refuses_what_cannot_fit_with_openais_context_length_error(gateway_url, upstream, alice):
    from sessions_app.services import session_create

    session = session_create(
        owner=alice,
        model="gpt-4o",
        context_limit=300,
        system_prompt="You are a coding agent. " * 40,
        settings={"autoCompact": False},
    )
    client = openai_client(gateway_url, key=token_for(alice), session=str(session.pk))
    system = {"role": "system", "content": "You are a coding agent. " * 40}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-4o", messages=[system, {"role": "user", "content": "fix it " * 30}]
        )
    error = caught.value.body
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "messages"
    assert error["limit"] == 300 and error["model"] == "gpt-4o" and error["tokenCount"] > 300
    assert upstream.requests == []

    # A single message larger than the whole window: refused before anything is stored.
    before = Event.objects.count()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-4o", messages=[system, {"role": "user", "content": "word " * 2000}]
        )
    assert caught.value.body["code"] == "context_length_exceeded"
    assert Event.objects.count() == before
    assert upstream.requests == []


def test_it_records_without_fitting_when_fit_is_off(gateway_url, upstream, alice):
    from sessions_app.services import session_create

    session = session_create(
        owner=alice, model="gpt-4o", context_limit=100, settings={"autoCompact": False}
    )
    client = openai_client(
        gateway_url, key=token_for(alice), session=str(session.pk), **{"X-Ledger-Fit": "off"}
    )
    messages = [{"role": "user", "content": "long " * 300}]
    client.chat.completions.create(model="gpt-4o", messages=messages)
    assert upstream.requests[-1].body["messages"] == messages
    assert Event.objects.filter(session=session).count() == 2


@pytest.mark.parametrize(
    "failure", [Step(kind="error", status=429), Step(kind="error", status=503)]
)
def test_it_fails_over_to_the_next_model(gateway_url, upstream, alice, failure):
    upstream.script(failure)
    client = openai_client(
        gateway_url,
        key=token_for(alice),
        session="failover",
        **{"X-Ledger-Fallback-Models": "gpt-4o-mini, gpt-4.1"},
    )
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
    )
    assert raw.headers["X-Ledger-Model"] == "gpt-4o-mini"
    assert [r.body["model"] for r in upstream.requests] == ["gpt-4o", "gpt-4o-mini"]
    reply = Event.objects.get(session__client_key="failover", type="AGENT_MESSAGE")
    assert reply.metadata["model"] == "gpt-4o-mini"


def test_it_fails_over_on_a_timeout(gateway_url, upstream, alice, settings):
    settings.LEDGER_UPSTREAM_TIMEOUT_SECONDS = 0.5
    upstream.script(Step(delay=1.5))
    client = openai_client(
        gateway_url, key=token_for(alice), session="slow", **{"X-Ledger-Fallback-Models": "gpt-4.1"}
    )
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
    )
    assert raw.headers["X-Ledger-Model"] == "gpt-4.1"


def test_it_returns_other_4xx_without_failing_over(gateway_url, upstream, alice):
    upstream.script(Step(kind="error", status=400, message="nope"))
    client = openai_client(
        gateway_url,
        key=token_for(alice),
        session="no-failover",
        **{"X-Ledger-Fallback-Models": "gpt-4.1"},
    )
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert len(upstream.requests) == 1


def test_it_fits_a_fallback_to_its_own_smaller_window(gateway_url, upstream, alice, settings):
    settings.MODEL_CONTEXT_OVERRIDES = {**settings.MODEL_CONTEXT_OVERRIDES, "tiny-model": 400}
    client = openai_client(gateway_url, key=token_for(alice), session="tiny")
    history = converse(client, 4)
    quiet(Session.objects.get(client_key="tiny"))
    upstream.script(Step(kind="error", status=429))
    fallback = openai_client(
        gateway_url,
        key=token_for(alice),
        session="tiny",
        **{"X-Ledger-Fallback-Models": "tiny-model"},
    )
    history.append({"role": "user", "content": "Status?"})
    raw = fallback.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    assert raw.headers["X-Ledger-Model"] == "tiny-model"
    assert raw.headers["X-Ledger-Compacted"] == "true"
    assert int(raw.headers["X-Ledger-Context-Tokens"]) <= 400
    assert upstream.requests[-2].body["messages"] == history
    assert len(upstream.requests[-1].body["messages"]) < len(history)


def test_it_answers_502_in_openais_shape_when_no_upstream_answers(gateway_url, alice, settings):
    from tests.support.helpers import closed_port

    settings.LEDGER_OPENAI_UPSTREAM = f"http://127.0.0.1:{closed_port()}/v1"
    client = openai_client(gateway_url, key=token_for(alice), session="down")
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_unavailable"
