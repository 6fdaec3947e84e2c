"""Google's Gen AI SDK (google-genai) through the gateway's Gemini wire, unmodified: plain,
streamed and function calling, on `v1` (the SDK's default) and `v1beta`, the provider
stand-in answering as Gemini does (see test_gateway_gemini_standin.py)."""

from __future__ import annotations

import json

import pytest
from google.genai import errors, types

from compaction_app.testkit.provider_standin import GEMINI_SIGNATURE, Step, error
from sessions_app.models import Call, Event, Session
from sessions_app.pricing import CallUsage, price_call
from tests.support.gateway_live import CANARY, gemini_client, token_for, wait_until
from tests.support.gemini import MANUAL, MODEL, WEATHER

pytestmark = pytest.mark.django_db(transaction=True)

VERSIONS = pytest.mark.parametrize("version", ["v1", "v1beta"])


def _user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def _calls(client_key: str, count: int) -> list[Call]:
    """The session's calls once all `count` are written (after each response is sent)."""
    found = wait_until(
        lambda: (
            len(calls := list(Call.objects.filter(session__client_key=client_key))) == count
            and calls
        )
    )
    return sorted(found, key=lambda call: call.started_at)


def _events(client_key: str) -> list[Event]:
    session = Session.objects.get(client_key=client_key)
    return list(Event.objects.filter(session=session).order_by("seq"))


@VERSIONS
def test_it_answers_plain_and_streamed(gemini_gateway_url, upstream, alice, version):
    key = f"genai-{version}"
    client = gemini_client(gemini_gateway_url, key=token_for(alice), session=key, version=version)
    upstream.script(
        Step(text="Audit, recall, compaction.", prompt_tokens=2000, cache_read_tokens=1024),
        Step(text="Audit and recall."),
    )
    history = [_user("Name three uses of a ledger.")]

    reply = client.models.generate_content(model=MODEL, contents=history)
    assert reply.text == "Audit, recall, compaction."
    assert reply.usage_metadata.cached_content_token_count == 1024  # relayed as sent
    plain = upstream.requests[-1]
    assert plain.path == f"/{version}/models/{MODEL}:generateContent"
    # The provider key goes upstream as the SDK sent it; the ledger's headers do not.
    assert plain.headers["x-goog-api-key"] == CANARY
    assert not any(name.startswith("x-ledger") for name in plain.headers)

    history += [reply.candidates[0].content, _user("Only two.")]
    pieces = [c.text for c in client.models.generate_content_stream(model=MODEL, contents=history)]
    assert "".join(pieces) == "Audit and recall." and len(pieces) > 1
    streamed = upstream.requests[-1]
    assert streamed.path == f"/{version}/models/{MODEL}:streamGenerateContent"
    assert streamed.query == "alt=sse"
    assert streamed.body["contents"] == json.loads(
        json.dumps([c.model_dump(mode="json", exclude_none=True) for c in history])
    )

    first, second = _calls(key, 2)
    assert (first.stream, second.stream) == (False, True)
    # Usage from usageMetadata: the prompt counts the cached tokens in; priced as such.
    assert (first.prompt_tokens, first.cached_input_tokens) == (2000, 1024)
    usage = CallUsage(
        input_tokens=2000, cached_input_tokens=1024, output_tokens=first.completion_tokens or 0
    )
    assert first.cost_nano_usd == price_call(MODEL, usage).nano_usd
    assert second.cost_nano_usd and second.completion_tokens
    stored = [(e.type, e.content) for e in _events(key)]
    assert stored == [
        ("USER_MESSAGE", "Name three uses of a ledger."),
        ("AGENT_MESSAGE", "Audit, recall, compaction."),
        ("USER_MESSAGE", "Only two."),
        ("AGENT_MESSAGE", "Audit and recall."),
    ]


@VERSIONS
def test_it_runs_a_function_calling_loop(gemini_gateway_url, upstream, alice, version):
    """The call streamed, its answer plain: the call's id and signature go back upstream
    exactly as they came, and the loop is recorded as a tool call and its result."""
    key = f"genai-tools-{version}"
    client = gemini_client(gemini_gateway_url, key=token_for(alice), session=key, version=version)
    config = types.GenerateContentConfig(
        system_instruction="Answer in one sentence.",
        tools=[WEATHER],
        automatic_function_calling=MANUAL,
    )
    upstream.script(
        Step(
            text="",
            tool_calls=(("call_01", "get_weather", json.dumps({"city": "Oslo"})),),
            thinking="Look the weather up.",
        ),
        Step(text="It is sunny in Oslo."),
    )
    history = [_user("What is the weather in Oslo?")]

    chunks = list(
        client.models.generate_content_stream(model=MODEL, contents=history, config=config)
    )
    [call] = chunks[-1].function_calls
    assert (call.id, call.name, call.args) == ("call_01", "get_weather", {"city": "Oslo"})
    history.append(chunks[-1].candidates[0].content)
    answer = types.Part.from_function_response(name="get_weather", response={"sky": "sunny"})
    answer.function_response.id = call.id
    history.append(types.Content(role="user", parts=[answer]))
    final = client.models.generate_content(model=MODEL, contents=history, config=config)
    assert final.text == "It is sunny in Oslo."

    before, after = upstream.requests[-2].body, upstream.requests[-1].body
    assert after["contents"][1]["parts"][0] == {
        "functionCall": {"id": "call_01", "name": "get_weather", "args": {"city": "Oslo"}},
        "thoughtSignature": GEMINI_SIGNATURE,
    }
    assert after["contents"][2]["parts"][0]["functionResponse"] == {
        "id": "call_01",
        "name": "get_weather",
        "response": {"sky": "sunny"},
    }
    # Instruction and tools forwarded unchanged from one call to the next.
    assert after["systemInstruction"] == before["systemInstruction"]
    assert after["tools"] == before["tools"]

    stored = _events(key)
    types_ = [e.type for e in stored]
    assert types_[0] == "SYSTEM_PROMPT" and stored[0].content == "Answer in one sentence."
    assert types_.count("TOOL_CALL") == 1 and types_.count("TOOL_RESULT") == 1
    assert types_.index("USER_MESSAGE") < types_.index("TOOL_CALL") < types_.index("TOOL_RESULT")
    tool_call = stored[types_.index("TOOL_CALL")]
    assert (tool_call.name, tool_call.tool_call_id) == ("get_weather", "call_01")
    assert "sunny" in stored[types_.index("TOOL_RESULT")].content
    assert types_[-1] == "AGENT_MESSAGE" and stored[-1].content == "It is sunny in Oslo."
    assert all(c.status == "ok" and c.cost_nano_usd for c in _calls(key, 2))


def test_it_counts_tokens_without_the_provider(gemini_gateway_url, upstream, alice):
    client = gemini_client(
        gemini_gateway_url, key=token_for(alice), session="genai-count", version="v1beta"
    )
    counted = client.models.count_tokens(model=MODEL, contents="How many tokens is this?")
    assert counted.total_tokens and counted.total_tokens > 0
    assert not [r for r in upstream.requests if r.path.endswith(":countTokens")]


def test_it_relays_the_providers_error_in_googles_shape(gemini_gateway_url, upstream, alice):
    client = gemini_client(
        gemini_gateway_url, key=token_for(alice), session="genai-error", version="v1"
    )
    upstream.script(error(400, "Request contains an invalid argument."))
    with pytest.raises(errors.ClientError) as failure:
        client.models.generate_content(model=MODEL, contents="Hi")
    assert (failure.value.code, failure.value.status) == (400, "INVALID_ARGUMENT")
    assert failure.value.message == "Request contains an invalid argument."
