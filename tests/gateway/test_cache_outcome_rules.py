"""The cache outcome's rules without a server (pure): the providers' lifetimes and minimums,
a client's own compaction, a history cut short, OpenAI's 128-token steps and its 24-hour
retention, Anthropic's one-hour breakpoints, and where the provider's figures disagree."""

from __future__ import annotations

import pytest

from compaction_app.gateway import cache_outcome as co
from compaction_app.gateway.providers.anthropic_messages.cache import cache_rules as anthropic
from compaction_app.gateway.providers.anthropic_messages.cache import minimum
from compaction_app.gateway.providers.gemini.cache import cache_rules as gemini
from compaction_app.gateway.providers.openai_chat.cache import cache_rules as openai

pytestmark = pytest.mark.profile_independent


def unit(name: str, tokens: int, role: str = "user", mark: int | None = None) -> co.Unit:
    return co.Unit(digest=name.ljust(co.DIGEST_CHARS, "0"), role=role, tokens=tokens, mark=mark)


def request(*units: co.Unit, model: str = "m", tools: str = "", auto: int | None = None, ttl=None):
    return co.Fingerprint(model=model, tools=tools, tools_tokens=0, units=units, auto=auto, ttl=ttl)


def before(fingerprint: co.Fingerprint, at: float = 0.0) -> co.Previous:
    return co.Previous.of(fingerprint.stored(), at=at, call_id="prev")


SYSTEM = unit("sys", 2000, "system")


def test_it_names_the_documented_minimums():
    assert (minimum("claude-opus-4-5"), minimum("claude-haiku-4.5")) == (4096, 4096)
    assert (minimum("claude-3-5-haiku-20241022"), minimum("claude-3-haiku")) == (2048, 2048)
    assert (minimum("claude-sonnet-4-5"), minimum("claude-3.5-sonnet")) == (1024, 1024)
    assert gemini("gemini-2.5-flash").min_tokens == 2048
    assert gemini("gemini-3-pro-preview").min_tokens == 4096
    assert openai("gpt-4o").min_tokens == 1024 and openai("gpt-4o").increment == 128


def test_it_reads_openais_prefix_in_128_token_steps():
    first = request(SYSTEM, unit("a", 300))
    second = request(SYSTEM, unit("a", 300), unit("b", 50))
    found = co.predict(current=second, previous=before(first), now=60, rules=openai("gpt-4o"))
    assert (found.outcome, found.reason) == ("hit", None)
    # 2,300 shared tokens: 1,024 + 9 × 128 of them can be read.
    assert found.predicted_read == 1024 + 9 * 128
    assert found.new_tokens == 50


def test_it_keeps_openais_extended_retention_for_a_day():
    first = request(SYSTEM, ttl=24 * 3600)
    second = request(SYSTEM, unit("b", 10), ttl=24 * 3600)
    late = co.predict(current=second, previous=before(first), now=3 * 3600, rules=openai("x"))
    assert late.outcome == "hit" and late.ttl_seconds == 24 * 3600
    plain = co.predict(
        current=request(SYSTEM, unit("b", 10)),
        previous=before(request(SYSTEM)),
        now=301,
        rules=openai("x"),
    )
    assert (plain.outcome, plain.reason) == ("miss", "ttl_expired")


def test_it_keeps_an_anthropic_one_hour_breakpoint_past_five_minutes():
    marked = co.Unit(digest="sys".ljust(12, "0"), role="system", tokens=2000, mark=3600)
    first = request(marked, unit("a", 10, mark=300))
    second = request(marked, unit("a", 10), unit("b", 10, mark=300))
    found = co.predict(current=second, previous=before(first), now=1800, rules=anthropic("m"))
    assert found.outcome == "hit" and found.ttl_seconds == 3600
    # Half an hour on, the 5-minute tail's entry is gone; the one-hour system block is read.
    assert found.predicted_read == 2000
    soon = co.predict(current=second, previous=before(first), now=60, rules=anthropic("m"))
    assert soon.predicted_read == 2010


def test_it_tells_a_clients_own_compaction_from_an_edit():
    history = [unit(f"m{n}", 400, "user" if n % 2 else "assistant") for n in range(10)]
    first = request(SYSTEM, *history)
    rewritten = request(SYSTEM, unit("summary", 300), unit("new", 20))
    found = co.predict(current=rewritten, previous=before(first), now=10, rules=openai("x"))
    assert (found.outcome, found.reason, found.by) == ("partial", "compaction", "client")
    edited = request(SYSTEM, *history[:3], unit("edited", 400), *history[4:], unit("new", 20))
    found = co.predict(current=edited, previous=before(first), now=10, rules=openai("x"))
    assert (found.outcome, found.reason) == ("partial", "history_edited")
    assert found.first_changed == {"index": 4, "role": "user", "change": "content"}


def test_it_says_when_a_history_was_cut_short():
    first = request(SYSTEM, unit("a", 10), unit("b", 10))
    shorter = request(SYSTEM, unit("a", 10))
    found = co.predict(current=shorter, previous=before(first), now=10, rules=openai("x"))
    assert found.reason == "history_edited"
    assert found.first_changed == {"index": 2, "role": "user", "change": "removed"}


def test_it_flags_provider_figures_that_disagree():
    rules = openai("x")
    hit = co.predict(
        current=request(SYSTEM, unit("b", 10)),
        previous=before(request(SYSTEM)),
        now=10,
        rules=rules,
    )
    assert hit.document(provider_read=0, provider_write=None, rules=rules)["agrees"] is False
    assert hit.document(provider_read=1024, provider_write=None, rules=rules)["agrees"] is True
    assert hit.document(provider_read=None, provider_write=None, rules=rules)["agrees"] is None
    miss = co.predict(current=request(SYSTEM), previous=None, now=0, rules=rules)
    assert miss.reason == "first_call"
    text = miss.document(provider_read=2000, provider_write=None, rules=rules)["contradiction"]
    assert "read 2,000 tokens" in text
    best_effort = gemini("gemini-2.5-flash")
    doc = hit.document(provider_read=0, provider_write=None, rules=best_effort)
    assert "best effort" in doc["contradiction"]
