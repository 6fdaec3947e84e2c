"""The provider stand-in speaks Gemini's wire as Google's SDK expects it: the gateway's
Gemini tests and Gemini CLI's run rely on it (compaction_app/testkit/provider_standin.py).
Driven here with the official google-genai SDK and with raw HTTP, on both API versions."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from google import genai
from google.genai import errors, types

from compaction_app.testkit.provider_standin import (
    GEMINI_IMPLICIT_CACHE_MIN,
    GEMINI_SIGNATURE,
    ProviderStandIn,
    Step,
    error,
    fake_gemini_token_count,
)
from tests.support.gemini import MANUAL, MODEL, WEATHER

pytestmark = pytest.mark.profile_independent


@pytest.fixture
def standin():
    with ProviderStandIn() as running:
        yield running


def _client(standin: ProviderStandIn, version: str) -> genai.Client:
    options = {"base_url": standin.gemini_url, "api_version": version}
    return genai.Client(api_key="gemini-fake-key", http_options=options)


@pytest.mark.parametrize("version", ["v1", "v1beta"])
def test_it_answers_the_sdk_plain_and_streamed(standin, version):
    client = _client(standin, version)
    standin.script(Step(text="Three uses."), Step(text="one two three"))

    reply = client.models.generate_content(model=MODEL, contents="Name three uses.")
    assert reply.text == "Three uses."
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP
    usage = reply.usage_metadata
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    plain = standin.requests[-1]
    assert plain.path == f"/{version}/models/{MODEL}:generateContent"
    assert plain.headers["x-goog-api-key"] == "gemini-fake-key"
    assert plain.body["contents"] == [{"parts": [{"text": "Name three uses."}], "role": "user"}]

    pieces = [
        chunk.text for chunk in client.models.generate_content_stream(model=MODEL, contents="Go")
    ]
    assert pieces == ["one ", "two ", "three"]
    streamed = standin.requests[-1]
    assert streamed.path == f"/{version}/models/{MODEL}:streamGenerateContent"
    assert streamed.query == "alt=sse"


def test_it_frames_a_stream_as_the_api_does(standin):
    """`alt=sse`: `data: {…}` frames ended by CRLF CRLF, no [DONE], each a whole response
    with usageMetadata, the finish reason on the last. Without it: one JSON array."""
    standin.script(Step(text="a b c"), Step(text="a b c"))
    url = f"{standin.gemini_url}/v1beta/models/{MODEL}:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "Go"}]}]}

    sse = httpx.post(url, params={"alt": "sse"}, json=body)
    assert sse.headers["content-type"] == "text/event-stream"
    assert sse.text.endswith("\r\n\r\n") and "[DONE]" not in sse.text
    frames = [frame for frame in sse.text.split("\r\n\r\n") if frame]
    assert all(frame.startswith("data: ") for frame in frames)
    chunks = [json.loads(frame.removeprefix("data: ")) for frame in frames]
    assert [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks] == ["a ", "b ", "c"]
    assert [c["candidates"][0].get("finishReason") for c in chunks] == [None, None, "STOP"]
    assert all(c["candidates"][0]["content"]["role"] == "model" for c in chunks)
    assert all("usageMetadata" in c for c in chunks)

    array = httpx.post(url, json=body).json()
    assert array == chunks


@pytest.mark.parametrize("version", ["v1", "v1beta"])
def test_it_calls_a_function_with_its_id_and_signature(standin, version):
    client = _client(standin, version)
    config = types.GenerateContentConfig(tools=[WEATHER], automatic_function_calling=MANUAL)
    standin.script(
        Step(text="", tool_calls=(("call_01", "get_weather", json.dumps({"city": "Oslo"})),)),
        Step(text="It is sunny in Oslo."),
    )
    history = [types.Content(role="user", parts=[types.Part(text="Weather in Oslo?")])]

    reply = client.models.generate_content(model=MODEL, contents=history, config=config)
    [call] = reply.function_calls
    assert (call.id, call.name, call.args) == ("call_01", "get_weather", {"city": "Oslo"})
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP  # no tool-use reason
    part = reply.candidates[0].content.parts[0]
    assert part.thought_signature == base64.b64decode(GEMINI_SIGNATURE)

    history.append(reply.candidates[0].content)
    answer = types.Part.from_function_response(name="get_weather", response={"sky": "sunny"})
    answer.function_response.id = call.id
    history.append(types.Content(role="user", parts=[answer]))
    final = client.models.generate_content(model=MODEL, contents=history, config=config)
    assert final.text == "It is sunny in Oslo."
    sent = standin.requests[-1].body
    # The call went back as it came: id, arguments and signature.
    assert sent["contents"][1]["parts"][0] == {
        "functionCall": {"id": "call_01", "name": "get_weather", "args": {"city": "Oslo"}},
        "thoughtSignature": GEMINI_SIGNATURE,
    }
    assert sent["contents"][2]["parts"][0]["functionResponse"]["id"] == "call_01"
    assert sent["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"


def test_it_streams_a_function_call_whole_in_one_chunk(standin):
    client = _client(standin, "v1beta")
    config = types.GenerateContentConfig(tools=[WEATHER], automatic_function_calling=MANUAL)
    calls = (
        ("call_01", "get_weather", json.dumps({"city": "Oslo"})),
        ("call_02", "get_weather", json.dumps({"city": "Rome"})),
    )
    standin.script(Step(text="Checking.", tool_calls=calls))
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="Go", config=config))
    assert "".join(chunk.text or "" for chunk in chunks[:-1]) == "Checking."
    assert [(c.id, c.args["city"]) for c in chunks[-1].function_calls] == [
        ("call_01", "Oslo"),
        ("call_02", "Rome"),
    ]
    parts = chunks[-1].candidates[0].content.parts
    assert parts[0].thought_signature and parts[1].thought_signature is None  # the first only


def test_it_shows_thoughts_only_when_asked(standin):
    client = _client(standin, "v1beta")
    standin.script(Step(text="Done.", thinking="Plan it."), Step(text="Done.", thinking="Plan it."))
    quiet = client.models.generate_content(model=MODEL, contents="Go")
    assert [p.text for p in quiet.candidates[0].content.parts] == ["Done."]
    assert quiet.candidates[0].content.parts[-1].thought_signature  # a reply that thought
    thinking = types.ThinkingConfig(include_thoughts=True)
    shown = client.models.generate_content(
        model=MODEL, contents="Go", config=types.GenerateContentConfig(thinking_config=thinking)
    )
    parts = shown.candidates[0].content.parts
    assert [(p.text, bool(p.thought)) for p in parts] == [("Plan it.", True), ("Done.", False)]
    usage = shown.usage_metadata
    assert usage.thoughts_token_count >= 1
    assert usage.total_token_count == (
        usage.prompt_token_count + usage.candidates_token_count + usage.thoughts_token_count
    )


def test_it_reports_implicit_caching_for_a_repeated_prefix(standin):
    """A conversation that resends its earlier turns is billed partly as cached, as Gemini's
    implicit caching does once the repeated prefix is long enough; a scripted figure wins."""
    client = _client(standin, "v1beta")
    long_turn = "The ledger keeps every event. " * 200  # about 1,500 tokens at 4 characters
    history = [types.Content(role="user", parts=[types.Part(text=long_turn)])]
    first = client.models.generate_content(model=MODEL, contents=history)
    assert first.usage_metadata.cached_content_token_count is None  # nothing seen before
    history += [
        first.candidates[0].content,
        types.Content(role="user", parts=[types.Part(text="More?")]),
    ]
    second = client.models.generate_content(model=MODEL, contents=history)
    cached = second.usage_metadata.cached_content_token_count
    assert GEMINI_IMPLICIT_CACHE_MIN <= cached < second.usage_metadata.prompt_token_count
    assert second.usage_metadata.cache_tokens_details[0].token_count == cached
    other_model = client.models.generate_content(model="gemini-2.5-pro", contents=history)
    assert other_model.usage_metadata.cached_content_token_count is None  # per model

    standin.script(Step(text="ok", prompt_tokens=5000, cache_read_tokens=4096))
    scripted = client.models.generate_content(model=MODEL, contents="short")
    assert scripted.usage_metadata.cached_content_token_count == 4096
    assert scripted.usage_metadata.prompt_token_count == 5000  # cached tokens are part of it


def test_it_counts_tokens(standin):
    client = _client(standin, "v1beta")
    counted = client.models.count_tokens(model=MODEL, contents="hello world")
    body = standin.requests[-1].body
    assert standin.requests[-1].path == f"/v1beta/models/{MODEL}:countTokens"
    assert counted.total_tokens == fake_gemini_token_count(body) == 7 + 4 + len("hello world") // 3


@pytest.mark.parametrize(
    ("status", "name", "raised"),
    [
        (400, "INVALID_ARGUMENT", errors.ClientError),
        (429, "RESOURCE_EXHAUSTED", errors.ClientError),
        (503, "UNAVAILABLE", errors.ServerError),
    ],
)
def test_it_answers_errors_in_googles_shape(standin, status, name, raised):
    client = _client(standin, "v1")
    standin.script(error(status, "scripted failure"))
    with pytest.raises(raised) as failure:
        client.models.generate_content(model=MODEL, contents="Go")
    assert (failure.value.code, failure.value.status) == (status, name)
    assert failure.value.message == "scripted failure"
    assert failure.value.details == {
        "error": {"code": status, "message": "scripted failure", "status": name}
    }


def test_it_fails_a_stream_midway_as_the_api_does(standin):
    client = _client(standin, "v1beta")
    standin.script(Step(kind="stream_error", text="a b c d", chunks_before_break=2))
    seen = []
    with pytest.raises(errors.ServerError) as failure:
        for chunk in client.models.generate_content_stream(model=MODEL, contents="Go"):
            seen.append(chunk.text)
    assert seen == ["a ", "b "]
    assert failure.value.status == "INTERNAL"
