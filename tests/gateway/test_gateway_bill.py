"""The provider bill: cache reads and writes each reply reports (official SDKs against the
stand-in, streamed and not), the session's counters and `/usage` (cost, hit rate, savings),
a model without a price, REST-reported cache figures, the websocket push and the schema."""

from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Event, Session
from sessions_app.pricing import NANO_PER_USD, CallUsage, price_call, price_input, usd
from sessions_app.services import session_update
from tests.support.gateway_live import anthropic_client, openai_client, token_for, wait_until
from tests.support.helpers import api_token, append_events, create_session, ws_communicator

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You are a terse coding agent."


def reply_of(client_key: str) -> Event:
    """The call's recorded reply (a stream's is recorded once the stream has ended)."""

    def find() -> Event | None:
        session = Session.objects.filter(client_key=client_key).first()
        if session is None:
            return None
        return Event.objects.filter(session=session, type="AGENT_MESSAGE").order_by("seq").last()

    return wait_until(find)


def usage_of(api, session_id) -> dict:
    response = api.get(f"/api/v1/sessions/{session_id}/usage")
    assert response.status_code == 200
    return response.json()


def expected_usd(model: str, **usage: int) -> float:
    price = price_call(model, CallUsage(**usage))
    assert price.nano_usd is not None
    return usd(price.nano_usd)


# --- OpenAI Chat Completions ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_it_records_openai_cached_tokens_and_prices_them(
    gateway_url, upstream, alice, alice_api, stream
):
    upstream.script(Step(text="ok then", prompt_tokens=2000, cache_read_tokens=1536))
    client = openai_client(gateway_url, key=token_for(alice), session=f"oa-{stream}")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    if stream:
        chunks = client.chat.completions.create(
            model="gpt-4o",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert [c for c in chunks][-1].usage.prompt_tokens_details.cached_tokens == 1536
    else:
        done = client.chat.completions.create(model="gpt-4o", messages=messages)
        assert done.usage.prompt_tokens_details.cached_tokens == 1536
    reply = reply_of(f"oa-{stream}")
    assert (reply.prompt_tokens, reply.cached_input_tokens, reply.cache_write_tokens) == (
        2000,
        1536,
        None,
    )
    body = usage_of(alice_api, reply.session_id)
    assert body["cachedInputTokens"] == 1536
    assert body["cacheWriteTokens"] == 0
    assert body["cacheHitRate"] == round(1536 / 2000, 4)
    completion = reply.completion_tokens
    assert body["costUsd"] == expected_usd(
        "gpt-4o", input_tokens=2000, cached_input_tokens=1536, output_tokens=completion
    )
    # Cached input is cheaper than uncached: the cost is below pricing all 2000 uncached.
    assert body["costUsd"] < expected_usd("gpt-4o", input_tokens=2000, output_tokens=completion)
    assert body["costUnknownReason"] is None
    # The event's tokenUsage carries the figure too.
    listed = alice_api.get(f"/api/v1/sessions/{reply.session_id}/events").json()
    usage = next(e for e in listed["results"] if e["type"] == "AGENT_MESSAGE")["tokenUsage"]
    assert usage["cachedInputTokens"] == 1536


# --- Anthropic Messages -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_it_records_anthropic_cache_reads_and_writes_with_the_one_hour_split(
    gateway_url, upstream, alice, alice_api, stream
):
    upstream.script(
        Step(
            text="done",
            prompt_tokens=5000,
            cache_read_tokens=3000,
            cache_write_tokens=1500,
            cache_write_1h_tokens=500,
        )
    )
    client = anthropic_client(gateway_url, key=token_for(alice), session=f"an-{stream}")
    request = {
        "model": "claude-3.5-sonnet",
        "max_tokens": 50,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Hi"}],
    }
    if stream:
        with client.messages.stream(**request) as events:
            final = events.get_final_message()
    else:
        final = client.messages.create(**request)
    assert final.usage.cache_read_input_tokens == 3000
    reply = reply_of(f"an-{stream}")
    # input 500 + cache write 1500 + cache read 3000: everything the model read.
    assert reply.prompt_tokens == 5000
    assert (reply.cached_input_tokens, reply.cache_write_tokens) == (3000, 1500)
    assert reply.metadata["usage"]["cache_creation"]["ephemeral_1h_input_tokens"] == 500
    body = usage_of(alice_api, reply.session_id)
    assert (body["cachedInputTokens"], body["cacheWriteTokens"]) == (3000, 1500)
    assert body["cacheHitRate"] == 0.6
    # claude-3.5-sonnet: 500 at $3, 3000 at $0.30, 1000 at $3.75, 500 at $6 per MTok, output $15.
    output = reply.completion_tokens
    by_hand = (500 * 3 + 3000 * 0.3 + 1000 * 3.75 + 500 * 6 + output * 15) / 1_000_000
    assert body["costUsd"] == pytest.approx(by_hand, abs=1e-8)


# --- savings ----------------------------------------------------------------------------------


def test_it_records_what_fitting_kept_from_being_sent(gateway_url, upstream, alice, alice_api):
    client = openai_client(gateway_url, key=token_for(alice), session="saver")
    history = [{"role": "system", "content": SYSTEM}]
    for turn in range(6):
        history.append({"role": "user", "content": f"Look at src/m_{turn}.py, bug {turn}. " * 12})
        answer = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
    session = Session.objects.get(client_key="saver")
    assert session.saved_tokens == 0  # forwarded as sent so far
    session = session_update(session=session, settings={"autoCompact": False})
    session_update(session=session, context_limit=int((session.context_tokens + 12) / 0.88))
    history.append({"role": "user", "content": "Status?"})
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    assert raw.headers["X-Ledger-Compacted"] == "true"
    forwarded = int(raw.headers["X-Ledger-Context-Tokens"])
    reply = reply_of("saver")
    client_tokens = reply.metadata["clientTokens"]
    assert client_tokens > forwarded
    assert reply.metadata["savedTokens"] == client_tokens - forwarded
    body = usage_of(alice_api, session.pk)
    assert body["savedTokens"] == client_tokens - forwarded
    assert body["savedUsd"] == usd(price_input("gpt-4o", client_tokens - forwarded).nano_usd)
    # The session page says it.
    from django.test import Client
    from django.urls import reverse

    browser = Client()
    browser.force_login(alice)
    page = browser.get(reverse("dashboard:session", args=[session.pk])).content.decode()
    assert f'id="saved-tokens">{client_tokens - forwarded:,}<' in page


# --- REST clients, unknown prices -------------------------------------------------------------


def test_it_accepts_cache_figures_from_rest_clients_and_sums_them(alice_api):
    session_id = create_session(alice_api)
    usage = {"promptTokens": 1000, "completionTokens": 10, "cachedInputTokens": 800}
    stored = append_events(
        alice_api,
        session_id=session_id,
        events=[
            {"type": "AGENT_MESSAGE", "content": "a", "tokenUsage": usage},
            {
                "type": "AGENT_MESSAGE",
                "content": "b",
                "tokenUsage": {"promptTokens": 1000, "cacheWriteTokens": 1000},
            },
        ],
    )
    assert stored[0]["tokenUsage"]["cachedInputTokens"] == 800
    body = usage_of(alice_api, session_id)
    assert (body["cachedInputTokens"], body["cacheWriteTokens"]) == (800, 1000)
    assert body["cacheHitRate"] == 0.4
    expected = expected_usd(
        "gpt-4o", input_tokens=1000, cached_input_tokens=800, output_tokens=10
    ) + expected_usd("gpt-4o", input_tokens=1000, cache_write_tokens=1000)
    assert body["costUsd"] == pytest.approx(expected, abs=1e-8)


def test_it_refuses_cache_figures_larger_than_the_prompt(alice_api):
    session_id = create_session(alice_api)
    response = alice_api.post(
        f"/api/v1/sessions/{session_id}/events",
        {
            "type": "AGENT_MESSAGE",
            "content": "a",
            "tokenUsage": {"promptTokens": 10, "cachedInputTokens": 11},
        },
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert Event.objects.filter(session_id=session_id).count() == 1  # the system prompt only


def test_it_gives_no_cost_and_a_reason_for_a_model_without_a_price(alice_api):
    response = alice_api.post(
        "/api/v1/sessions",
        {"model": "acme-house-model-7", "contextLimit": 32000},
        format="json",
    )
    assert response.status_code == 201, response.json()
    session_id = response.json()["id"]
    append_events(
        alice_api,
        session_id=session_id,
        events={"type": "AGENT_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": 90}},
    )
    body = usage_of(alice_api, session_id)
    # The known sum (nothing here), with the calls it leaves out counted and named: one call
    # without a price never hides the rest of the bill.
    assert body["costUsd"] == 0.0 and body["unpricedCalls"] == 1
    assert body["savedUsd"] == 0.0
    assert "1 call with no price" in body["costUnknownReason"]
    assert "acme-house-model-7" in body["costUnknownReason"]


# --- websocket and schema ---------------------------------------------------------------------


def test_it_pushes_the_bill_in_usage_updated(alice, alice_api):
    session_id = create_session(alice_api)
    token = api_token(alice)

    async def scenario():
        communicator = ws_communicator(f"/ws/sessions/{session_id}/", token=token)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await sync_to_async(append_events)(
            alice_api,
            session_id=session_id,
            events={
                "type": "AGENT_MESSAGE",
                "content": "ok",
                "tokenUsage": {"promptTokens": 100, "cachedInputTokens": 50},
            },
        )
        while True:
            message = await communicator.receive_json_from(timeout=5)
            if message["type"] == "USAGE_UPDATED" and message["sessionId"] == session_id:
                break
        await communicator.disconnect()
        return message["usage"]

    usage = async_to_sync(scenario)()
    assert usage["cachedInputTokens"] == 50
    assert usage["cacheHitRate"] == 0.5
    assert usage["costUsd"] > 0
    for key in ("cacheWriteTokens", "costUnknownReason", "savedTokens", "savedUsd"):
        assert key in usage


def test_it_lists_the_bill_in_the_openapi_schema():
    from drf_spectacular.generators import SchemaGenerator

    components = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    usage = components["Usage"]["properties"]
    for key in (
        "cachedInputTokens",
        "cacheWriteTokens",
        "cacheHitRate",
        "costUsd",
        "costUnknownReason",
        "savedTokens",
        "savedUsd",
    ):
        assert key in usage, key
    assert "cachedInputTokens" in components["TokenUsage"]["properties"]


# --- dashboard --------------------------------------------------------------------------------


def test_it_shows_cost_hit_rate_and_savings_on_the_list_and_the_session_page(alice, alice_api):
    from django.test import Client
    from django.urls import reverse

    session_id = create_session(alice_api)
    append_events(
        alice_api,
        session_id=session_id,
        events=[
            {
                "type": "AGENT_MESSAGE",
                "content": "a",
                "tokenUsage": {"promptTokens": 1000, "completionTokens": 10},
            },
            {
                "type": "AGENT_MESSAGE",
                "content": "b",
                "tokenUsage": {
                    "promptTokens": 1000,
                    "completionTokens": 10,
                    "cachedInputTokens": 600,
                },
            },
        ],
    )
    from sessions_app.pricing import usd_text

    session = Session.objects.get(pk=session_id)
    cost = usd_text(Decimal(session.cost_nano_usd) / NANO_PER_USD)
    assert cost == usd_text(usage_of(alice_api, session_id)["costUsd"])
    browser = Client()
    browser.force_login(alice)
    listed = browser.get(reverse("dashboard:sessions")).content.decode()
    assert cost in listed
    assert "30.0 % cached" in listed
    page = browser.get(reverse("dashboard:session", args=[session_id])).content.decode()
    assert cost in page
    assert 'id="hit-rate">30.0 %' in page
    assert "fitting saved" not in page  # nothing saved yet: not said
    # The chart's input strip: one bar per call, the second one with its cached part.
    assert page.count('class="input-bar"') == 2
    assert "#3: 1,000 input, 600 cached" in page or "#3: 1000 input, 600 cached" in page


def test_it_refuses_an_append_that_would_take_the_cost_past_its_bound(alice_api):
    # 10^12 prompt and completion tokens on gpt-4o: $12.5 million a call, 720 of them pass
    # the $9 × 10⁹ a session's cost may reach. Refused whole, nothing stored, never a 500.
    session_id = create_session(alice_api)
    # (With its total: without one, prompt + completion would pass the bound of a total.)
    huge = {"promptTokens": 10**12, "completionTokens": 10**12, "totalTokens": 10**12}
    bulk = [{"type": "AGENT_MESSAGE", "content": "r", "tokenUsage": huge}] * 800
    response = alice_api.post(f"/api/v1/sessions/{session_id}/events", bulk, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["error"] == "token_usage_total_exceeded"
    assert Event.objects.filter(session_id=session_id).count() == 1
    stored = alice_api.post(f"/api/v1/sessions/{session_id}/events", bulk[:100], format="json")
    assert stored.status_code == 201
    assert usage_of(alice_api, session_id)["costUsd"] == pytest.approx(100 * 12.5e6)
