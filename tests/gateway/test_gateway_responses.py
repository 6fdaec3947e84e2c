"""The gateway's OpenAI Responses endpoint (`/gateway/openai/v1/responses`), driven by the
official `openai` SDK (`client.responses.create`, plain, streamed, with tools) and the OpenAI
Agents SDK's default model, against daphne serving the app and the provider stand-in."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from compaction_app.gateway.messages import GatewayInputError
from compaction_app.gateway.providers import openai_responses as responses
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Event, Session
from sessions_app.services import session_update
from tests.support.gateway_live import CANARY, openai_client, token_for, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}


def events_of(session: Session) -> list[Event]:
    return list(Event.objects.filter(session=session).order_by("seq"))


def test_it_records_a_plain_response_and_forwards_the_body_as_sent(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-plain")
    raw = client.responses.with_raw_response.create(
        model="gpt-4o", instructions="Be terse.", input="List the files."
    )
    response = raw.parse()
    assert response.output_text == "Hello from the stand-in."
    session = Session.objects.get(owner=alice, client_key="resp-plain")
    assert raw.headers["X-Ledger-Session"] == str(session.pk)
    assert int(raw.headers["X-Ledger-Context-Tokens"]) > 0
    sent = upstream.requests[-1]
    assert sent.path == "/v1/responses"
    assert sent.body == {"model": "gpt-4o", "instructions": "Be terse.", "input": "List the files."}
    assert sent.headers["authorization"] == f"Bearer {CANARY}"
    assert not any(name.startswith("x-ledger") for name in sent.headers)
    stored = events_of(session)
    assert [(e.type, e.content) for e in stored] == [
        ("SYSTEM_PROMPT", "Be terse."),
        ("USER_MESSAGE", "List the files."),
        ("AGENT_MESSAGE", "Hello from the stand-in."),
    ]
    assert stored[-1].prompt_tokens == response.usage.input_tokens
    assert stored[-1].completion_tokens == response.usage.output_tokens


def test_it_relays_a_streamed_response_event_by_event_and_records_it(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-stream")
    upstream.script(Step(text="one two three"))
    kinds: list[str] = []
    text: list[str] = []
    with client.responses.stream(model="gpt-4o", input="Count.") as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text.append(event.delta)
        final = stream.get_final_response()
    assert "".join(text) == "one two three" == final.output_text
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds
    session = Session.objects.get(client_key="resp-stream")
    stored = events_of(session)
    assert [(e.type, e.content) for e in stored][-1] == ("AGENT_MESSAGE", "one two three")
    assert stored[-1].prompt_tokens == final.usage.input_tokens
    assert not stored[-1].metadata.get("incomplete")


def test_it_completes_a_tool_loop_resending_everything(gateway_url, upstream, alice):
    """A `store: false` client (Codex's way): each request resends the whole input, the
    reply's output items included; only what is new is recorded."""
    client = openai_client(gateway_url, key=token_for(alice), session="resp-tools")
    upstream.script(
        Step(text="", tool_calls=(("call_1", "read_file", '{"path": "a.py"}'),)),
        Step(text="a.py prints a"),
    )
    history: list = [{"role": "user", "content": "What does a.py do?"}]
    first = client.responses.create(model="gpt-4o", input=history, tools=[TOOL], store=False)
    call = first.output[0]
    assert call.type == "function_call" and call.call_id == "call_1"
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": "call_1", "output": "print('a')"})
    with client.responses.stream(
        model="gpt-4o", input=history, tools=[TOOL], store=False
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "a.py prints a"
    # The second request went upstream as the client sent it.
    assert upstream.requests[-1].body["input"][1]["type"] == "function_call"
    session = Session.objects.get(client_key="resp-tools")
    stored = events_of(session)
    assert [(e.type, e.tool_call_id) for e in stored] == [
        ("USER_MESSAGE", ""),
        ("TOOL_CALL", "call_1"),
        ("TOOL_RESULT", "call_1"),
        ("AGENT_MESSAGE", ""),
    ]
    assert stored[1].name == "read_file"
    assert json.loads(stored[1].content) == {"path": "a.py"}
    assert stored[2].content == "print('a')"
    assert stored[3].content == "a.py prints a"


def test_it_keeps_reasoning_and_unknown_items_as_json(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-items")
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": "gAAAA-opaque",
    }
    compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque-summary"}
    items = [
        compaction,
        {"role": "user", "content": "go on"},
        reasoning,
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "on it"}],
        },
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]},
    ]
    client.responses.create(model="gpt-4o", input=items)
    assert upstream.requests[-1].body["input"] == items  # byte for byte
    stored = events_of(Session.objects.get(client_key="resp-items"))
    assert [e.type for e in stored] == [
        "AGENT_MESSAGE",  # the compaction item: model-side, kept as JSON
        "USER_MESSAGE",
        "AGENT_MESSAGE",  # reasoning + message, one reply
        "USER_MESSAGE",
        "AGENT_MESSAGE",
    ]
    assert json.loads(stored[0].content) == [compaction]
    assert json.loads(stored[2].content)[0]["encrypted_content"] == "gAAAA-opaque"
    assert json.loads(stored[3].content) == [{"type": "input_image", "image_url": "data:x"}]


def test_it_records_only_the_new_input_of_a_previous_response_id_client(
    gateway_url, upstream, alice
):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-chain")
    first = client.responses.create(model="gpt-4o", input="Hi")
    client.responses.create(model="gpt-4o", input="And then?", previous_response_id=first.id)
    # Forwarded as sent: the gateway cannot fit a conversation it does not see.
    assert upstream.requests[-1].body == {
        "model": "gpt-4o",
        "input": "And then?",
        "previous_response_id": first.id,
    }
    stored = events_of(Session.objects.get(client_key="resp-chain"))
    assert [(e.type, e.content) for e in stored] == [
        ("USER_MESSAGE", "Hi"),
        ("AGENT_MESSAGE", "Hello from the stand-in."),
        ("USER_MESSAGE", "And then?"),
        ("AGENT_MESSAGE", "Hello from the stand-in."),
    ]


def test_it_fails_over_to_the_next_model(gateway_url, upstream, alice):
    client = openai_client(
        gateway_url,
        key=token_for(alice),
        session="resp-failover",
        **{"X-Ledger-Fallback-Models": "gpt-4o-mini"},
    )
    upstream.script(Step(kind="error", status=429), Step(text="from the fallback"))
    raw = client.responses.with_raw_response.create(model="gpt-4o", input="Hi")
    assert raw.parse().output_text == "from the fallback"
    assert raw.headers["X-Ledger-Model"] == "gpt-4o-mini"
    assert [r.body["model"] for r in upstream.requests] == ["gpt-4o", "gpt-4o-mini"]


def test_it_answers_bad_input_in_openais_shape(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-bad")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-4o", input=5)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "input"
    assert upstream.requests == []
    assert not Event.objects.exists()


def test_it_passes_the_responses_side_endpoints_through(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-side")
    fetched = client.responses.retrieve("resp_abc")
    assert fetched.id == "resp_abc"
    counted = client.responses.input_tokens.count(model="gpt-4o", input="Hi")
    assert counted.input_tokens > 0
    compacted = client.post(
        "/responses/compact", body={"model": "gpt-4o", "input": "Hi"}, cast_to=httpx.Response
    )
    assert compacted.json()["output"][0]["type"] == "compaction"
    assert [(r.method, r.path) for r in upstream.requests] == [
        ("GET", "/v1/responses/resp_abc"),
        ("POST", "/v1/responses/input_tokens"),
        ("POST", "/v1/responses/compact"),
    ]
    assert all(r.headers["authorization"] == f"Bearer {CANARY}" for r in upstream.requests)
    assert not Event.objects.exists()  # passthroughs record nothing
    # Without an API token the gateway forwards nothing: it is no open proxy.
    anonymous = openai_client(gateway_url, key=None, session=None)
    with pytest.raises(openai.AuthenticationError):
        anonymous.responses.retrieve("resp_abc")
    assert len(upstream.requests) == 3


def test_it_completes_a_tool_loop_with_the_agents_sdks_default_model(gateway_url, upstream, alice):
    try:
        import agents
    except ModuleNotFoundError as exc:
        if exc.name != "agents":
            raise  # installed, but a dependency is missing: a failure, not a skip
        pytest.skip("openai-agents is not installed (.ci/run installs it)")
    upstream.script(
        Step(text="", tool_calls=(("call_w", "get_weather", '{"city": "Oslo"}'),)),
        Step(text="It is sunny in Oslo."),
    )

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(
        api_key=CANARY,
        base_url=f"{gateway_url}/gateway/openai/v1",
        default_headers={"X-Ledger-Key": token_for(alice), "X-Ledger-Session": "agents-resp"},
        max_retries=0,
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the tool.",
        tools=[get_weather],
        # The SDK's default model class: the Responses API.
        model=agents.OpenAIResponsesModel(model="gpt-4o", openai_client=client),
    )
    agents.set_tracing_disabled(True)
    result = asyncio.run(agents.Runner.run(agent, "Weather in Oslo?"))
    assert result.final_output == "It is sunny in Oslo."
    assert all(r.path == "/v1/responses" for r in upstream.requests)
    stored = events_of(Session.objects.get(client_key="agents-resp"))
    assert [e.type for e in stored] == [
        "SYSTEM_PROMPT",
        "USER_MESSAGE",
        "TOOL_CALL",
        "TOOL_RESULT",
        "AGENT_MESSAGE",
    ]
    assert stored[3].content == "sunny in Oslo"


def test_it_converts_fitted_messages_back_into_input_items():
    """The ledger renders a fitted context in Chat shape; the Responses wire turns it back
    into input items (instructions kept apart when the client used them)."""
    body = {"model": "m", "instructions": "old", "input": "x", "store": False}
    fitted = responses.with_context(
        body,
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Summary of earlier work"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            {"role": "assistant", "content": [{"type": "reasoning", "id": "rs"}]},
        ],
        system=None,
        model="m2",
    )
    assert fitted["instructions"] == "Be terse."
    assert fitted["model"] == "m2" and fitted["store"] is False
    assert fitted["input"] == [
        {"type": "message", "role": "user", "content": "Summary of earlier work"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {"type": "reasoning", "id": "rs"},
    ]


def test_it_relays_a_streamed_tool_call_and_records_it(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-stream-tool")
    upstream.script(Step(text="", tool_calls=(("call_s", "read_file", '{"path": "b.py"}'),)))
    arguments: list[str] = []
    with client.responses.stream(model="gpt-4o", input="Read b.py", tools=[TOOL]) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                arguments.append(event.delta)
        final = stream.get_final_response()
    assert "".join(arguments) == '{"path": "b.py"}'
    assert final.output[0].type == "function_call"
    stored = events_of(Session.objects.get(client_key="resp-stream-tool"))
    assert [(e.type, e.name, e.tool_call_id) for e in stored] == [
        ("USER_MESSAGE", "", ""),
        ("TOOL_CALL", "read_file", "call_s"),
    ]
    assert stored[-1].prompt_tokens == final.usage.input_tokens


def test_it_fits_a_resent_conversation_at_the_hard_limit_as_input_items(
    gateway_url, upstream, alice
):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-fit")
    items: list = []
    for turn in range(6):
        items.append({"role": "user", "content": f"Look at module {turn} and fix it. " * 12})
        reply = client.responses.create(
            model="gpt-4o", instructions="You are a coding agent.", input=items, store=False
        )
        items += [item.model_dump(exclude_none=True) for item in reply.output]
    session = session_update(
        session=Session.objects.get(client_key="resp-fit"),
        settings={"autoCompact": False, "keepRecentEvents": 1},
    )
    session_update(session=session, context_limit=int((session.context_tokens + 12) / 0.97))
    items.append({"role": "user", "content": "Status?"})
    raw = client.responses.with_raw_response.create(
        model="gpt-4o", instructions="You are a coding agent.", input=items, store=False
    )
    assert raw.headers["X-Ledger-Compacted"] == "true"
    sent = upstream.requests[-1].body
    # The client's own request, fitted in its own shape: `instructions` as sent, shorter
    # input (the summary as a developer message), the client's other fields kept, the new turn
    # last exactly as the client wrote it.
    assert sent["instructions"] == "You are a coding agent."
    assert sent["store"] is False
    assert len(sent["input"]) < len(items)
    assert sent["input"][-1] == {"role": "user", "content": "Status?"}
    assert all(item.get("type") or item.get("role") for item in sent["input"])
    assert any(
        item.get("role") == "developer" and "summary" in str(item.get("content")).lower()
        for item in sent["input"]
    )


def test_it_marks_a_stream_cut_short_as_incomplete(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="resp-break")
    upstream.script(Step(kind="break", text="one two three four", chunks_before_break=5))
    with client.responses.stream(model="gpt-4o", input="Count.") as stream:
        kinds = [event.type for event in stream]
    # The upstream broke off: the client gets the API's own error event, last.
    assert kinds[-1] == "error" and "response.completed" not in kinds
    session = Session.objects.get(client_key="resp-break")

    def recorded() -> list[Event]:
        return [e for e in events_of(session) if e.type == "AGENT_MESSAGE"]

    reply = wait_until(recorded)[0]
    assert reply.metadata["incomplete"] is True
    assert reply.content and "one two three four".startswith(reply.content)


def test_it_reads_what_the_provider_holds_as_a_continuation():
    """A stored prompt or a previous response: the request may carry no input at all."""
    parsed = responses.parse_request({"model": "m", "prompt": {"id": "pmpt_1"}})
    assert parsed.continues and parsed.units == []
    parsed = responses.parse_request({"model": "m", "input": [], "previous_response_id": "r"})
    assert parsed.continues
    with pytest.raises(GatewayInputError):
        responses.parse_request({"model": "m", "input": []})
    # Instructions first, then the input; a reply's run of output items is one unit.
    parsed = responses.parse_request(
        {
            "model": "m",
            "instructions": "sys",
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "id": "rs", "summary": []},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "ok"},
            ],
        }
    )
    messages = [responses.to_client_message(unit, i) for i, unit in enumerate(parsed.units)]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert [d.type for d in messages[2].drafts] == ["AGENT_MESSAGE", "TOOL_CALL"]
