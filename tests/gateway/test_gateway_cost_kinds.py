"""Cost by the provider's rules, per token kind, against each provider's documented example
figures (sent by the stand-in exactly as the provider documents its usage object, read by the
official SDKs through the gateway) priced by hand at the published rates: cached input inside
(OpenAI, Gemini) or beside (Anthropic) the input, 5-minute and one-hour cache writes apart,
Anthropic's compaction iterations added (each priced as its own request), reasoning tokens,
and a stream without usage recorded as absent with a marked estimate, never 0."""

from __future__ import annotations

from decimal import Decimal

import pytest

from compaction_app.gateway import after
from compaction_app.testkit.provider_standin import Step, raw_json
from sessions_app import pricing
from sessions_app.models import Call, Session
from tests.support.gateway_live import anthropic_client, gemini_client, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

MTOK = Decimal(1_000_000)


def the_call(client_key: str) -> Call:
    after.wait_idle()
    return Call.objects.get(session__client_key=client_key)


def kinds(call: Call) -> dict[str, tuple[int, Decimal]]:
    return {
        kind: (value["tokens"], Decimal(str(value["usd"])))
        for kind, value in call.cost_by_kind.items()
    }


def usd(call: Call) -> Decimal:
    return Decimal(call.cost_nano_usd) / 10**9


def session_cost(api, client_key: str) -> Decimal:
    session = Session.objects.get(client_key=client_key)
    return Decimal(str(api.get(f"/api/v1/sessions/{session.pk}/usage").json()["costUsd"]))


# --- OpenAI -------------------------------------------------------------------------------------


def _chat_completion(model: str, usage: dict) -> dict:
    return {
        "id": "chatcmpl-doc",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok", "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage,
    }


def test_it_prices_openais_documented_cached_prompt_inside_the_input(
    gateway_url, upstream, alice, alice_api
):
    # The usage object of OpenAI's prompt-caching guide: 2,006 prompt tokens of which 1,920
    # read from the cache, 300 completion tokens.
    usage = {
        "prompt_tokens": 2006,
        "completion_tokens": 300,
        "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    upstream.script(raw_json(_chat_completion("gpt-4o", usage)))
    client = openai_client(gateway_url, key=token_for(alice), session="oa-doc")
    done = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
    )
    assert done.usage.prompt_tokens_details.cached_tokens == 1920
    call = the_call("oa-doc")
    # gpt-4o: $2.50 input, $1.25 cached input, $10 output per million.
    assert kinds(call) == {
        "input": (86, 86 * Decimal("2.50") / MTOK),
        "cacheRead": (1920, 1920 * Decimal("1.25") / MTOK),
        "output": (300, 300 * Decimal(10) / MTOK),
    }
    by_hand = (86 * Decimal("2.50") + 1920 * Decimal("1.25") + 300 * 10) / MTOK
    assert usd(call) == by_hand == Decimal("0.005615")
    assert session_cost(alice_api, "oa-doc") == by_hand
    assert call.usage_status == "reported" and not call.cost_estimated


def test_it_shows_reasoning_tokens_as_part_of_the_output(gateway_url, upstream, alice):
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 1500,
        "total_tokens": 2500,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 1200},
    }
    upstream.script(raw_json(_chat_completion("o3", usage)))
    client = openai_client(gateway_url, key=token_for(alice), session="oa-reasoning")
    client.chat.completions.create(model="o3", messages=[{"role": "user", "content": "Think"}])
    call = the_call("oa-reasoning")
    assert call.reasoning_tokens == 1200
    found = kinds(call)
    # o3: $2 input, $8 output per million; reasoning is billed as output and is part of it.
    assert found["output"] == (1500, 1500 * Decimal(8) / MTOK)
    assert found["reasoning"] == (1200, 1200 * Decimal(8) / MTOK)
    assert usd(call) == (1000 * 2 + 1500 * 8) / MTOK


def test_it_estimates_a_stream_without_usage_and_marks_it(gateway_url, upstream, alice, alice_api):
    upstream.script(Step(text="a streamed answer with no usage at the end"))
    client = openai_client(gateway_url, key=token_for(alice), session="oa-absent")
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "Stream it"}], stream=True
        )
    )
    assert all(chunk.usage is None for chunk in chunks)
    call = the_call("oa-absent")
    assert call.usage_status == "absent" and call.cost_estimated
    assert call.prompt_tokens == call.forwarded_tokens > 0 and call.completion_tokens > 0
    assert (
        call.cost_nano_usd
        == pricing.price_call(
            "gpt-4o",
            pricing.CallUsage(
                input_tokens=call.prompt_tokens, output_tokens=call.completion_tokens
            ),
        ).nano_usd
    )
    assert call.cost_nano_usd > 0
    listed = alice_api.get(f"/api/v1/sessions/{call.session_id}/calls").json()["results"][0]
    assert listed["usage"] == "absent" and listed["costEstimated"] is True
    assert listed["costUsd"] > 0
    # The session's bill counts it apart from what the provider reported.
    bill = alice_api.get(f"/api/v1/sessions/{call.session_id}/usage").json()
    assert bill["estimatedCalls"] == 1 and bill["estimatedCostUsd"] == listed["costUsd"]
    assert bill["costUsd"] == 0.0


# --- Anthropic ----------------------------------------------------------------------------------


def _message(model: str, usage: dict) -> dict:
    return {
        "id": "msg_doc",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }


def test_it_prices_anthropics_documented_cache_write_then_read_beside_the_input(
    gateway_url, upstream, alice, alice_api
):
    # The prompt-caching guide's example: the book is written to the cache (188,086 tokens),
    # then read from it; 21 uncached input tokens and 393 output tokens each time.
    write = {
        "input_tokens": 21,
        "cache_creation_input_tokens": 188086,
        "cache_read_input_tokens": 0,
        "output_tokens": 393,
    }
    read = {**write, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 188086}
    upstream.script(
        raw_json(_message("claude-sonnet-4-5", write)),
        raw_json(_message("claude-sonnet-4-5", read)),
    )
    client = anthropic_client(gateway_url, key=token_for(alice), session="an-doc")
    for text in ("Analyze the themes.", "Now the characters."):
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": text}]
        )
    after.wait_idle()
    first, second = Call.objects.filter(session__client_key="an-doc").order_by("started_at")
    # claude-sonnet-4-5 (under 200,000 input tokens): $3 input, $3.75 5-minute write,
    # $0.30 read, $15 output per million.
    assert kinds(first) == {
        "input": (21, 21 * Decimal(3) / MTOK),
        "cacheWrite5m": (188086, 188086 * Decimal("3.75") / MTOK),
        "output": (393, 393 * Decimal(15) / MTOK),
    }
    assert usd(first) == Decimal("0.7112805")
    assert usd(second) == (21 * 3 + 188086 * Decimal("0.30") + 393 * 15) / MTOK
    assert first.prompt_tokens == second.prompt_tokens == 21 + 188086
    assert session_cost(alice_api, "an-doc") == usd(first) + usd(second)


def test_it_prices_one_hour_writes_at_twice_the_input_apart_from_five_minute_ones(
    gateway_url, upstream, alice
):
    usage = {
        "input_tokens": 100,
        "cache_creation_input_tokens": 3000,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000},
        "output_tokens": 50,
    }
    upstream.script(raw_json(_message("claude-3.5-sonnet", usage)))
    client = anthropic_client(gateway_url, key=token_for(alice), session="an-1h")
    client.messages.create(
        model="claude-3.5-sonnet", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    )
    call = the_call("an-1h")
    assert call.cache_write_1h_tokens == 2000
    assert kinds(call) == {
        "input": (100, 100 * Decimal(3) / MTOK),
        "cacheWrite5m": (1000, 1000 * Decimal("3.75") / MTOK),
        "cacheWrite1h": (2000, 2000 * Decimal(6) / MTOK),
        "output": (50, 50 * Decimal(15) / MTOK),
    }


def test_it_adds_anthropics_compaction_iterations_each_priced_as_its_own_request(
    gateway_url, upstream, alice, alice_api
):
    # The compaction guide's example: the top-level usage is the message iteration only; the
    # compaction iteration (180,000 in, 3,500 out) is billed beside it.
    usage = {
        "input_tokens": 23000,
        "output_tokens": 1000,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "iterations": [
            {
                "type": "compaction",
                "input_tokens": 180000,
                "output_tokens": 3500,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
            {
                "type": "message",
                "input_tokens": 23000,
                "output_tokens": 1000,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        ],
    }
    upstream.script(raw_json(_message("claude-sonnet-4-5", usage)))
    client = anthropic_client(gateway_url, key=token_for(alice), session="an-iterations")
    client.messages.create(
        model="claude-sonnet-4-5", max_tokens=8, messages=[{"role": "user", "content": "Go"}]
    )
    call = the_call("an-iterations")
    assert (call.prompt_tokens, call.completion_tokens) == (203000, 4500)
    # Each sampling is its own request under the 200,000-token tier: $3 in, $15 out; their
    # sum (203,000) would wrongly cross into the long-context rate.
    by_hand = (203000 * 3 + 4500 * 15) / MTOK
    assert usd(call) == by_hand == Decimal("0.6765")
    assert kinds(call)["input"] == (203000, 203000 * Decimal(3) / MTOK)
    assert session_cost(alice_api, "an-iterations") == by_hand


# --- Gemini -------------------------------------------------------------------------------------


def test_it_prices_geminis_cached_content_inside_the_prompt_and_thoughts_as_output(
    gemini_gateway_url, upstream, alice
):
    from tests.support.gemini import MODEL

    usage = {
        "promptTokenCount": 12000,
        "cachedContentTokenCount": 8000,
        "candidatesTokenCount": 300,
        "thoughtsTokenCount": 500,
        "toolUsePromptTokenCount": 200,
        "totalTokenCount": 13000,
    }
    body = {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}
        ],
        "usageMetadata": usage,
        "modelVersion": MODEL,
    }
    upstream.script(raw_json(body))
    client = gemini_client(
        gemini_gateway_url, key=token_for(alice), session="gm-doc", version="v1beta"
    )
    client.models.generate_content(model=MODEL, contents="Hi")
    call = the_call("gm-doc")
    # gemini-2.5-flash: $0.30 input, $0.03 cached, $2.50 output (thinking included) per
    # million; the tool-use prompt is input beside the prompt.
    assert (call.prompt_tokens, call.cached_input_tokens) == (12200, 8000)
    assert call.completion_tokens == 800 and call.reasoning_tokens == 500
    assert kinds(call) == {
        "input": (4200, 4200 * Decimal("0.30") / MTOK),
        "cacheRead": (8000, 8000 * Decimal("0.03") / MTOK),
        "output": (800, 800 * Decimal("2.50") / MTOK),
        "reasoning": (500, 500 * Decimal("2.50") / MTOK),
    }
    assert (
        usd(call) == (4200 * Decimal("0.30") + 8000 * Decimal("0.03") + 800 * Decimal("2.5")) / MTOK
    )
