"""Why each call hit or missed the provider's prompt cache: replays through the gateway with
the official SDKs against the stand-in, whose simulated cache (testkit/prompt_cache.py) reads
and writes the way the provider documents it. The client changes its tools mid-way, edits an
old message, switches model, waits past the cache's lifetime (the gateway's clock moved
forward, not slept) and the gateway compacts: each call's outcome and reason are right, the
provider's figures agree with them, and the session's cost is the provider's figures priced
by hand from the published rates."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from compaction_app.gateway import after, clock
from compaction_app.testkit.prompt_cache import PromptCache
from sessions_app.models import Call, Session
from sessions_app.services import session_update
from tests.support.gateway_live import anthropic_client, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

MTOK = Decimal(1_000_000)
RULES = " ".join(
    f"Rule {n}: read the module before editing it, keep functions small, run the tests of "
    f"module_{n} after each change and report what changed and why."
    for n in range(60)
)
TOOLS_A = [
    {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}},
    {"name": "run_tests", "description": "Run the tests", "input_schema": {"type": "object"}},
]
TOOLS_B = [*TOOLS_A, {"name": "grep", "description": "Search", "input_schema": {"type": "object"}}]


@pytest.fixture
def cache(upstream):
    clock.reset()
    upstream.prompt_cache = PromptCache(clock=clock.timestamp)
    yield upstream.prompt_cache
    clock.reset()


def calls_of(client_key: str) -> list[Call]:
    after.wait_idle()
    session = Session.objects.get(client_key=client_key)
    return list(Call.objects.filter(session=session).order_by("started_at"))


def outcomes(calls: list[Call]) -> list[tuple[str, str]]:
    return [(c.cache_outcome, c.cache_reason) for c in calls]


def _compact_next_call(client_key: str) -> None:
    """Shrink the session's window so that the next call crosses the compact threshold (the
    gateway then compacts its thread once, in the call path)."""
    session = Session.objects.get(client_key=client_key)
    session = session_update(session=session, settings={"autoCompact": False})
    session_update(session=session, context_limit=int(session.context_tokens / 0.86))


# --- Anthropic Messages -----------------------------------------------------------------------


def _anthropic_turns(count: int, start: int = 0) -> list[dict]:
    turns = []
    for n in range(start, start + count):
        turns.append({"role": "user", "content": f"Step {n}: look at module_{n}.py and fix it."})
        # Long answers: what a compaction folds (user requests are kept).
        turns.append(
            {
                "role": "assistant",
                "content": f"Done with module_{n}.py. "
                + f"Checked handler_{n} and its callers. " * 60,
            }
        )
    return turns


def _with_tail_marker(history: list[dict]) -> list[dict]:
    """The client's breakpoint on its newest block, as agent CLIs place it."""
    *head, last = history
    block = {"type": "text", "text": last["content"], "cache_control": {"type": "ephemeral"}}
    return [*head, {"role": last["role"], "content": [block]}]


class _AnthropicAgent:
    """An agent on the Messages API through the gateway: a cached system prompt, tools, and
    its breakpoint moved onto its newest block on every call."""

    def __init__(self, gateway_url: str, user, key: str) -> None:
        self.client = anthropic_client(gateway_url, key=token_for(user), session=key)
        self.system = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
        self.history = _anthropic_turns(6)[:-1]
        self.usages: list = []

    def call(self, *, model: str = "claude-3.5-sonnet", tools: list[dict] = TOOLS_A) -> None:
        reply = self.client.messages.create(
            model=model,
            max_tokens=64,
            system=self.system,
            tools=tools,
            messages=_with_tail_marker(self.history),
        )
        self.usages.append(reply.usage)
        self.history.append({"role": "assistant", "content": reply.content[0].text})

    def turn(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})

    def by_hand(self) -> Decimal:
        """Every reply's figures priced at the published per-million rates (claude-3.5-sonnet
        and claude-sonnet-4-5 alike: $3 input, $3.75 5-minute cache write, $0.30 cache read,
        $15 output)."""
        return sum(
            (
                (
                    Decimal(u.input_tokens) * 3
                    + Decimal(u.cache_creation_input_tokens) * Decimal("3.75")
                    + Decimal(u.cache_read_input_tokens) * Decimal("0.30")
                    + Decimal(u.output_tokens) * 15
                )
                / MTOK
                for u in self.usages
            ),
            Decimal(0),
        )


def _assert_agrees(calls: list[Call]) -> None:
    for row in calls:
        assert row.cache["agrees"] is True, (row.cache_outcome, row.cache)
        assert (row.cache["providerCachedTokens"] > 0) == (row.cache_outcome in ("hit", "partial"))


def _assert_bill(api, calls: list[Call], by_hand: Decimal) -> None:
    bill = api.get(f"/api/v1/sessions/{calls[0].session_id}/usage").json()
    assert Decimal(str(bill["costUsd"])) == pytest.approx(by_hand, abs=Decimal("1e-8"))
    rows = sum(Decimal(c.cost_nano_usd) for c in calls) / 10**9
    assert rows == pytest.approx(by_hand, abs=Decimal("1e-8"))


def test_it_explains_each_anthropic_calls_cache_outcome_and_prices_the_bill_by_hand(
    gateway_url, upstream, cache, alice, alice_api
):
    agent = _AnthropicAgent(gateway_url, alice, "cache-why")
    agent.call()  # 1: the first call writes the prefix
    agent.turn("Now module_9.py.")
    agent.call()  # 2: the previous request plus a turn: read from the cache
    agent.turn("Add grep to your tools.")
    agent.call(tools=TOOLS_B)  # 3: tools changed
    agent.turn("Go on.")
    agent.call(tools=TOOLS_B)  # 4
    agent.turn("Switch models.")
    agent.call(model="claude-sonnet-4-5", tools=TOOLS_B)  # 5: model changed
    agent.turn("Go on.")
    agent.call(model="claude-sonnet-4-5", tools=TOOLS_B)  # 6
    clock.advance(6 * 60)  # past the 5-minute lifetime
    agent.turn("Back after a break.")
    agent.call(model="claude-sonnet-4-5", tools=TOOLS_B)  # 7: the cache expired
    _compact_next_call("cache-why")
    agent.turn("Long task: " + "check every module carefully. " * 40)
    agent.call(model="claude-sonnet-4-5", tools=TOOLS_B)  # 8: the gateway compacts
    agent.turn("Go on.")
    agent.call(model="claude-sonnet-4-5", tools=TOOLS_B)  # 9: cache-stable again

    calls = calls_of("cache-why")
    assert outcomes(calls) == [
        ("miss", "first_call"),
        ("hit", ""),
        ("miss", "tools_changed"),
        ("hit", ""),
        ("miss", "model_changed"),
        ("hit", ""),
        ("miss", "ttl_expired"),
        ("partial", "compaction"),
        ("hit", ""),
    ]
    assert calls[2].cache["change"] == "tools" and calls[4].cache["change"] == "model"
    assert calls[6].cache["gapSeconds"] >= 360 and calls[6].cache["ttlSeconds"] == 300
    assert calls[7].cache["by"] == "gateway" and calls[7].cache["change"] == "compacted"
    # The summary went in as a second system block: the client's own first block (unit 0,
    # block 0, with its breakpoint) is read again.
    assert calls[7].cache["firstChangedMessage"] == {
        "index": 0,
        "role": "system",
        "change": "content",
        "block": 1,
    }
    _assert_agrees(calls)
    _assert_bill(alice_api, calls, agent.by_hand())
    # The API shows the outcome on each call.
    listed = alice_api.get(f"/api/v1/sessions/{calls[0].session_id}/calls?limit=100").json()
    shown = {row["id"]: row["cache"] for row in listed["results"]}
    assert shown[str(calls[2].id)]["reason"] == "tools_changed"
    # And the dashboard's calls table.
    browser = Client()
    browser.force_login(alice)
    table = browser.get(f"/sessions/{calls[0].session_id}/calls/").content.decode()
    assert "tools_changed" in table and "ttl_expired" in table and "compaction (gateway)" in table


def test_it_names_the_message_an_anthropic_client_edited(
    gateway_url, upstream, cache, alice, alice_api
):
    agent = _AnthropicAgent(gateway_url, alice, "cache-edit")
    agent.call()
    agent.turn("Go on.")
    agent.call()
    agent.history[2] = {"role": "user", "content": "Step 1: look at module_1.py and module_7.py."}
    agent.turn("I edited my second request.")
    agent.call()  # an old message edited
    agent.turn("Go on.")
    agent.call()
    _compact_next_call("cache-edit")
    agent.turn("Long task: " + "check every module carefully. " * 40)
    agent.call()  # the gateway compacts a history it holds another version of
    calls = calls_of("cache-edit")
    assert outcomes(calls)[:4] == [
        ("miss", "first_call"),
        ("hit", ""),
        ("partial", "history_edited"),
        ("hit", ""),
    ]
    # The request's fourth unit (the system prompt is unit 0): the client's second request.
    assert calls[2].cache["firstChangedMessage"] == {
        "index": 3,
        "role": "user",
        "change": "content",
    }
    # With an edited message the ledger's thread no longer holds every message the client
    # sends, so the compacted request is rebuilt from the ledger, without the client's
    # breakpoints: uncacheable, and said so.
    assert outcomes(calls)[4] == ("not_cacheable", "compaction")
    assert calls[4].cache["change"] == "breakpoints_dropped" and calls[4].cache["by"] == "gateway"
    _assert_agrees(calls)
    _assert_bill(alice_api, calls, agent.by_hand())


def test_it_says_why_a_call_cannot_be_cached_at_all(gateway_url, upstream, cache, alice):
    client = anthropic_client(gateway_url, key=token_for(alice), session="uncacheable")
    short = [{"role": "user", "content": "Hi"}]
    client.messages.create(model="claude-3.5-sonnet", max_tokens=8, messages=short)
    client.messages.create(
        model="claude-3.5-sonnet",
        max_tokens=8,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=short,
    )
    calls = calls_of("uncacheable")
    assert outcomes(calls) == [
        ("not_cacheable", "no_cache_marker"),
        ("not_cacheable", "below_minimum"),
    ]
    assert calls[1].cache["minimumTokens"] == 1024
    assert all(c.cache["agrees"] for c in calls)


def test_it_flags_provider_figures_that_contradict_the_prediction(gateway_url, upstream, alice):
    from compaction_app.testkit.provider_standin import Step

    client = anthropic_client(gateway_url, key=token_for(alice), session="contradicted")
    system = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
    history = [{"role": "user", "content": "Hi"}]
    # The provider says it read nothing on the second call, though nothing changed.
    upstream.script(
        Step(text="one", prompt_tokens=3000, cache_write_tokens=2900),
        Step(text="two", prompt_tokens=3010, cache_write_tokens=3000),
    )
    for text in ("one", "two"):
        client.messages.create(
            model="claude-3.5-sonnet", max_tokens=8, system=system, messages=history
        )
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": "More"}]
    calls = calls_of("contradicted")
    assert outcomes(calls) == [("miss", "first_call"), ("hit", "")]
    assert calls[1].cache["agrees"] is False
    assert "read nothing" in calls[1].cache["contradiction"]


# --- OpenAI Chat Completions ------------------------------------------------------------------

OPENAI_TOOLS_A = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
]
OPENAI_TOOLS_B = [
    *OPENAI_TOOLS_A,
    {"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}},
]


def test_it_explains_each_openai_calls_cache_outcome_and_prices_the_bill_by_hand(
    gateway_url, upstream, cache, alice, alice_api
):
    client = openai_client(gateway_url, key=token_for(alice), session="cache-why-openai")
    history: list[dict] = [{"role": "system", "content": RULES}, *_anthropic_turns(6)[:-1]]
    usages = []

    def call(*, model: str = "gpt-4o", tools: list[dict] = OPENAI_TOOLS_A) -> None:
        reply = client.chat.completions.create(model=model, messages=history, tools=tools)
        usages.append((model, reply.usage))
        history.append({"role": "assistant", "content": reply.choices[0].message.content})

    def turn(text: str) -> None:
        history.append({"role": "user", "content": text})

    call()
    turn("Next.")
    call()
    turn("Add grep.")
    call(tools=OPENAI_TOOLS_B)
    turn("Go on.")
    call(tools=OPENAI_TOOLS_B)
    history[3] = {"role": "user", "content": "Step 1: look at module_1.py and module_8.py."}
    turn("I edited my second request.")
    call(tools=OPENAI_TOOLS_B)
    turn("Switch.")
    call(model="gpt-4.1", tools=OPENAI_TOOLS_B)
    turn("Go on.")
    call(model="gpt-4.1", tools=OPENAI_TOOLS_B)
    clock.advance(11 * 60)
    turn("Back.")
    call(model="gpt-4.1", tools=OPENAI_TOOLS_B)
    _compact_next_call("cache-why-openai")
    turn("Long task: " + "check every module carefully. " * 40)
    call(model="gpt-4.1", tools=OPENAI_TOOLS_B)
    turn("Go on.")
    call(model="gpt-4.1", tools=OPENAI_TOOLS_B)

    calls = calls_of("cache-why-openai")
    assert outcomes(calls) == [
        ("miss", "first_call"),
        ("hit", ""),
        ("miss", "tools_changed"),
        ("hit", ""),
        ("partial", "history_edited"),
        ("miss", "model_changed"),
        ("hit", ""),
        ("miss", "ttl_expired"),
        ("partial", "compaction"),
        ("hit", ""),
    ]
    assert calls[4].cache["firstChangedMessage"] == {
        "index": 3,
        "role": "user",
        "change": "content",
    }
    for row in calls:
        assert row.cache["agrees"] is True, (row.cache_outcome, row.cache)
    # gpt-4o: $2.50 input, $1.25 cached input, $10 output; gpt-4.1: $2, $0.50, $8.
    rates = {"gpt-4o": ("2.50", "1.25", "10"), "gpt-4.1": ("2", "0.50", "8")}
    by_hand = Decimal(0)
    for model, u in usages:
        fresh, cached, out = (Decimal(r) for r in rates[model])
        read = u.prompt_tokens_details.cached_tokens
        by_hand += (
            (u.prompt_tokens - read) * fresh + read * cached + u.completion_tokens * out
        ) / MTOK
    bill = alice_api.get(f"/api/v1/sessions/{calls[0].session_id}/usage").json()
    assert Decimal(str(bill["costUsd"])) == pytest.approx(by_hand, abs=Decimal("1e-8"))
