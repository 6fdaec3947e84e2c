"""A compaction's economics: what it sheds per call, the cache write it causes, the calls it
takes to pay back (predicted at the session's model prices), and the net dollars measured on
the gateway calls after it — in the API, the COMPACTION_COMPLETE message, the session page,
and summed on the session."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from django.test import Client

from compaction_app import economics
from compaction_app.gateway import after
from compaction_app.models import CompactionRun
from compaction_app.realtime.messages import compaction_complete
from compaction_app.testkit.prompt_cache import PromptCache
from sessions_app import pricing
from sessions_app.models import Call, Session
from sessions_app.services import session_update
from tests.support.gateway_live import anthropic_client, token_for

MTOK = Decimal(1_000_000)
SONNET = pricing.rates("claude-3.5-sonnet")


@pytest.mark.profile_independent
def test_it_predicts_the_shed_the_write_and_the_payback_at_the_models_prices():
    assert SONNET is not None
    found = economics.predicted(
        tokens_before=10_000, tokens_after=3_000, head_tokens=1_000, rates=SONNET
    )
    # claude-3.5-sonnet: $3.75 cache write, $0.30 cache read per million tokens.
    premium = Decimal(2_000) * (Decimal("3.75") - Decimal("0.30")) / MTOK
    saving = Decimal(7_000) * Decimal("0.30") / MTOK
    assert found == {
        "tokensShedPerCall": 7_000,
        "cacheWriteTokens": 2_000,
        "cacheWriteUsd": 0.0075,
        "cacheWritePremiumUsd": float(premium),
        "savingPerCallUsd": float(saving),
        "paybackCalls": math.ceil(premium / saving),
    }
    assert found["paybackCalls"] == 4
    nothing = economics.predicted(
        tokens_before=3_000, tokens_after=3_000, head_tokens=0, rates=SONNET
    )
    assert nothing["paybackCalls"] is None


@pytest.mark.profile_independent
def test_it_prices_a_call_as_if_the_compaction_had_not_happened():
    # The first call after a compaction: 3,000 prompt tokens (1,000 read, 1,500 written,
    # 500 fresh), 100 out. Without the compaction it would have sent 7,000 tokens more, read
    # from the cache, and read 1,400 of its written tokens instead of writing them.
    counterfactual = economics.counterfactual_nano(
        model="claude-3.5-sonnet",
        prompt=3_000,
        cached=1_000,
        write=1_500,
        write_1h=0,
        output=100,
        reasoning=0,
        shed=7_000,
        moved=1_400,
    )
    # 500 fresh at $3, 9,400 read at $0.30, 100 written at $3.75, 100 out at $15.
    assert counterfactual == (500 * 3 + 9_400 * 0.3 + 100 * 3.75 + 100 * 15) * 1_000
    actual = pricing.price_call(
        "claude-3.5-sonnet",
        pricing.CallUsage(
            input_tokens=3_000,
            cached_input_tokens=1_000,
            cache_write_tokens=1_500,
            output_tokens=100,
        ),
    ).nano_usd
    assert actual == (500 * 3 + 1_000 * 0.3 + 1_500 * 3.75 + 100 * 15) * 1_000
    # A cold call (nothing read): the shed tokens would have been fresh input.
    cold = economics.counterfactual_nano(
        model="claude-3.5-sonnet",
        prompt=3_000,
        cached=0,
        write=0,
        write_1h=0,
        output=0,
        reasoning=0,
        shed=1_000,
        moved=0,
    )
    assert cold == 4_000 * 3 * 1_000


RULES = " ".join(
    f"Rule {n}: read the module before editing it and run the tests of module_{n}."
    for n in range(90)
)


@pytest.mark.django_db(transaction=True)
def test_it_measures_the_net_dollars_on_the_calls_after_a_gateway_compaction(
    gateway_url, upstream, alice, alice_api
):
    upstream.prompt_cache = PromptCache()
    client = anthropic_client(gateway_url, key=token_for(alice), session="economics")
    system = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
    history: list[dict] = []
    for n in range(6):
        history.append({"role": "user", "content": f"Step {n}: fix module_{n}.py."})
        history.append(
            {
                "role": "assistant",
                "content": f"Fixed module_{n}.py. " + "Checked its callers. " * 80,
            }
        )

    def call(text: str) -> None:
        history.append({"role": "user", "content": text})
        messages = [
            *history[:-1],
            {
                "role": "user",
                "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
            },
        ]
        reply = client.messages.create(
            model="claude-3.5-sonnet", max_tokens=32, system=system, messages=messages
        )
        history.append({"role": "assistant", "content": reply.content[0].text})

    call("Go on.")
    call("Go on.")
    after.wait_idle()
    session = Session.objects.get(client_key="economics")
    session = session_update(session=session, settings={"autoCompact": False})
    session_update(session=session, context_limit=int(session.context_tokens / 0.86))
    call("Long task: " + "check every module. " * 40)  # the gateway compacts here
    for _ in range(3):
        call("Go on.")
    after.wait_idle()

    run = CompactionRun.objects.get(session=session, status="completed")
    calls = list(Call.objects.filter(session=session).order_by("started_at"))
    after_run = calls[2:]
    assert run.measured_calls == len(after_run) == 4
    assert run.first_call_id == after_run[0].id
    assert run.first_call_write_tokens == after_run[0].cache_write_tokens > 0
    # Each measured call: its counterfactual price less what it cost.
    shed = run.tokens_before - run.tokens_after
    expected = 0
    for index, row in enumerate(after_run):
        scale = row.prompt_tokens / row.forwarded_tokens
        moved = 0
        if index == 0:
            doc = row.cache
            moved = round(
                max(doc["promptTokens"] - doc["sharedTokens"] - doc["newTokens"], 0) * scale
            )
        expected += (
            economics.counterfactual_nano(
                model=row.model_served,
                prompt=row.prompt_tokens,
                cached=row.cached_input_tokens or 0,
                write=row.cache_write_tokens or 0,
                write_1h=row.cache_write_1h_tokens or 0,
                output=row.completion_tokens or 0,
                reasoning=0,
                shed=round(shed * scale),
                moved=moved,
            )
            - row.cost_nano_usd
        )
    assert run.measured_net_nano_usd == expected
    # The API: the run's economics, predicted and measured; the session's net in its list.
    doc = alice_api.get(f"/api/v1/compactions/{run.pk}").json()["economics"]
    assert doc["tokensShedPerCall"] == shed
    assert doc["cacheWriteTokens"] > 0 and doc["paybackCalls"] >= 1
    assert doc["measured"] == {
        "calls": 4,
        "netUsd": pricing.usd(expected),
        "firstCallCacheWriteTokens": after_run[0].cache_write_tokens,
        "complete": False,
    }
    listed = alice_api.get("/api/v1/sessions").json()["results"]
    mine = next(row for row in listed if row["id"] == str(session.pk))
    assert mine["compactionNetUsd"] == pricing.usd(expected)
    usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    assert usage["compactionNetUsd"] == pricing.usd(expected)
    # The websocket's COMPACTION_COMPLETE carries the prediction.
    message = compaction_complete(run).model_dump()
    assert message["economics"]["tokensShedPerCall"] == shed
    assert message["economics"]["paybackCalls"] == doc["paybackCalls"]
    # The session page shows it in the compaction history, the sessions list the net.
    browser = Client()
    browser.force_login(alice)
    html = browser.get(f"/sessions/{session.pk}/").content.decode()
    assert f"−{shed:,} tok/call" in html and "pays back in" in html and "over 4 calls" in html
    listing = browser.get("/").content.decode()
    assert "compactions" in listing and "net" in listing
