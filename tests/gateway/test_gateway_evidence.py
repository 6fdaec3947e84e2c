"""Facts of real tools' output through the gateway (issue 24): a session of routine tool output
with real outputs buried in it, sent on the Chat Completions wire, is compacted in the call path
with the same summarizer as the REST path (or, when the session's strategy asks for it, its old
tool results cleared to placeholders that keep each output's salient lines), and what the
gateway forwards still holds the facts written beside each output."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_app.gateway import after
from compaction_app.models import CompactionRun, Trigger
from compaction_app.policy import summary_bound
from compaction_app.testkit.tool_output_session import (
    buried_session,
    chat_messages,
    facts_kept,
    load_corpus,
)
from sessions_app.models import Session
from sessions_app.threads import main_thread
from tests.gateway.test_gateway_cache_stable import prefix_stable
from tests.support.gateway_live import openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "gpt-4.1"


def forwarded_text(body: dict) -> str:
    return "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))


def ask_past_the_threshold(
    gateway_url: str,
    alice,
    alice_api,
    *,
    fixtures: list,
    key: str,
    settings: dict | None = None,
    routine: int = 60,
) -> tuple[Any, list[dict], Any, Session]:
    """The buried session's history through the gateway; then a context limit that puts it,
    with its closing question added, between compactThreshold and the hard limit (and the
    session `settings` given); then the question. Returns the client, the history sent last,
    the raw answer to the question and the session."""
    events = buried_session(fixtures, routine=routine)
    history = chat_messages(events[:-2])
    client = openai_client(gateway_url, key=token_for(alice), session=key)
    reply = client.chat.completions.create(model=MODEL, messages=history)
    after.wait_idle()
    session = Session.objects.get(client_key=key)
    tokens = main_thread(session=session).context_tokens
    patch: dict[str, Any] = {"contextLimit": int(tokens / 0.88)}
    if settings is not None:
        patch["settings"] = settings
    response = alice_api.patch(f"/api/v1/sessions/{session.pk}", patch, format="json")
    assert response.status_code == 200, response.content
    history += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": events[-2]["content"]},
    ]
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=history)
    return client, history, raw, session


def test_it_forwards_the_facts_of_buried_tool_outputs_after_summarizing_in_the_call_path(
    gateway_url, upstream, alice, alice_api
):
    corpus = {fixture.name: fixture for fixture in load_corpus()}
    fixtures = [corpus["kubectl_describe_pod"], corpus["go_panic"]]
    # A low fitTargetRatio, so clearing old tool results alone cannot reach it: it summarizes.
    _, _, raw, session = ask_past_the_threshold(
        gateway_url,
        alice,
        alice_api,
        fixtures=fixtures,
        key="buried",
        settings={"maxSummaryTokens": 2000, "fitTargetRatio": 0.1},
    )
    assert raw.headers["X-Ledger-Compacted"] == "true"
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    assert (run.status, run.strategy, run.summarizer) == ("completed", "summarize", "local")
    sent = forwarded_text(upstream.requests[-1].body)
    for fixture in fixtures:
        # The output was folded (not forwarded as it came), its facts are in the summary.
        assert fixture.text not in sent
        assert facts_kept(sent, fixture.facts) == list(fixture.facts), fixture.name


def test_it_summarizes_by_default_even_where_clearing_alone_would_reach_the_mark(
    gateway_url, upstream, alice, alice_api
):
    corpus = {fixture.name: fixture for fixture in load_corpus()}
    fixtures = [corpus["kubectl_describe_pod"], corpus["tsc_errors"]]
    # The default fitTargetRatio (0.5), which clearing the old tool results alone reaches (the
    # next test): the session's strategy, summarize, runs all the same.
    _, _, raw, session = ask_past_the_threshold(
        gateway_url, alice, alice_api, fixtures=fixtures, key="buried-default"
    )
    assert raw.headers["X-Ledger-Compacted"] == "true"
    after.wait_idle()
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    assert (run.status, run.strategy, run.summarizer) == ("completed", "summarize", "local")
    sent = forwarded_text(upstream.requests[-1].body)
    for fixture in fixtures:
        assert facts_kept(sent, fixture.facts) == list(fixture.facts), fixture.name


def test_it_forwards_the_facts_of_buried_tool_outputs_after_clearing_them_when_asked(
    gateway_url, upstream, alice, alice_api
):
    corpus = {fixture.name: fixture for fixture in load_corpus()}
    fixtures = [corpus["kubectl_describe_pod"], corpus["tsc_errors"]]
    # A session that asks for observation masking: its old tool results are cleared.
    client, history, raw, session = ask_past_the_threshold(
        gateway_url,
        alice,
        alice_api,
        fixtures=fixtures,
        key="buried-cleared",
        settings={"strategy": "clear_tool_results"},
    )
    assert raw.headers["X-Ledger-Compacted"] == "true"
    after.wait_idle()
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    assert (run.status, run.strategy) == ("completed", "clear_tool_results")
    cleared = upstream.requests[-1]
    sent = forwarded_text(cleared.body)
    for fixture in fixtures:
        # Cleared (its facts in its placeholder) or, the newest, kept whole in the room the
        # target leaves: either way its facts go out.
        assert facts_kept(sent, fixture.facts) == list(fixture.facts), fixture.name
    # The older output was cleared, not forwarded as it came.
    assert fixtures[0].text not in sent
    # The placeholders are stored once: the next call forwards the same prefix, byte for byte.
    history += [
        {"role": "assistant", "content": raw.parse().choices[0].message.content},
        {"role": "user", "content": "And the pods?"},
    ]
    client.chat.completions.create(model=MODEL, messages=history)
    after.wait_idle()
    assert prefix_stable(cleared, upstream.requests[-1])
    assert CompactionRun.objects.filter(session=session).count() == 1


def test_it_fills_the_room_below_the_target_with_the_newest_turns_kept_whole(
    gateway_url, upstream, alice, alice_api
):
    """Summarizing in the call path on the auto bound: the summary stays within its bound and
    the room the target leaves goes to the newest turns, verbatim (each call with its result),
    after the summary, as they happened; never to a bigger summary (issue 38)."""
    corpus = {fixture.name: fixture for fixture in load_corpus()}
    fixtures = [corpus["kubectl_describe_pod"], corpus["go_panic"]]
    client, history, raw, session = ask_past_the_threshold(
        gateway_url,
        alice,
        alice_api,
        fixtures=fixtures,
        key="room",
        settings={"fitTargetRatio": 0.1},
        routine=240,
    )
    assert raw.headers["X-Ledger-Compacted"] == "true"
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    assert (run.status, run.strategy) == ("completed", "summarize")
    session.refresh_from_db()
    bound = summary_bound(context_limit=session.context_limit, max_summary_tokens=None)
    summary = alice_api.get(f"/api/v1/sessions/{session.pk}/summary").json()
    assert 0 < summary["tokenCount"] <= bound
    sent = upstream.requests[-1].body["messages"]
    # The tail of the forwarded request is the client's own newest turns, byte for byte: more
    # tool results than keepRecentEvents (2) keeps, each right after the call that made it.
    originals = {m["tool_call_id"]: m["content"] for m in history if m.get("role") == "tool"}
    tools = [k for k, m in enumerate(sent) if m.get("role") == "tool"]
    assert len(tools) > 2
    for k in tools:
        assert sent[k]["content"] == originals[sent[k]["tool_call_id"]]
        (call,) = sent[k - 1]["tool_calls"]
        assert call["id"] == sent[k]["tool_call_id"]
    # They are the newest: the last of them is the last the client sent.
    last_tool = max(k for k, m in enumerate(history) if m.get("role") == "tool")
    assert sent[tools[-1]]["tool_call_id"] == history[last_tool]["tool_call_id"]
    # The summary comes before them, and from the first kept turn on the request is the
    # client's own history as it happened.
    first_turn = tools[0] - 1
    assert any("[#" in str(m.get("content")) for m in sent[:first_turn])
    tail = sent[first_turn:]
    assert [(m["role"], m.get("content")) for m in tail] == [
        (m["role"], m.get("content")) for m in history[-len(tail) :]
    ]
