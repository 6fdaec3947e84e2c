"""A call's story (`GET /api/v1/calls/{id}`): the request as sent and as forwarded, rebuilt
from the ledger with each message's fate at the call's moment (kept, summarized, cleared,
pruned), the reply, masked headers, usage and cost by kind, the latency split, the run the
call triggered and its neighbours; another user's call is a 404."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from compaction_app.gateway import after
from compaction_app.models import CompactionRun, Trigger
from compaction_app.testkit.provider_standin import Step
from sessions_app.models import Call, Event, Session
from sessions_app.services import session_update
from tests.support.gateway_live import openai_client, token_for, wait_until
from tests.support.helpers import api_token

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def _api(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client


def _calls(key: str) -> list[Call]:
    after.wait_idle()
    return list(Call.objects.filter(session__client_key=key).order_by("started_at"))


def _converse(client, history, turns: int, words: str = "Please fix bug") -> None:
    for turn in range(turns):
        history.append({"role": "user", "content": f"{words} {turn}. " * 30})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})


def test_it_tells_what_was_sent_and_forwarded_before_and_after_a_compaction(
    gateway_url, upstream, alice, bob
):
    client = openai_client(gateway_url, key=token_for(alice), session="story")
    history = [SYSTEM]
    _converse(client, history, 8)
    after.wait_idle()
    session = Session.objects.get(client_key="story")
    session = session_update(session=session, settings={"autoCompact": False})
    session_update(session=session, context_limit=int(session.context_tokens / 0.85))
    history.append({"role": "user", "content": "Status?"})
    upstream.script(Step(text="All good.", prompt_tokens=300, cache_read_tokens=100))
    client.chat.completions.create(model="gpt-4o", messages=history)
    calls = _calls("story")
    assert len(calls) == 9
    before, compacting = calls[-2], calls[-1]
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)

    api = _api(alice)
    story = api.get(f"/api/v1/calls/{compacting.pk}").json()
    messages = story["request"]["messages"]
    # The request as the client sent it: every message, in order, the last one last.
    assert len(messages) == len(history) == story["request"]["messages"][-1]["index"] + 1
    assert [m["content"] for m in messages] == [m["content"] for m in history]
    fates = [m["fate"] for m in messages]
    assert fates[0] == "kept" and fates[-1] == "kept"  # the system prompt and the question
    assert "summarized" in fates
    summarized = [m for m in messages if m["fate"] == "summarized"]
    assert {m["summarySeq"] for m in summarized} == {run.compaction_event.seq}
    (summary,) = story["request"]["summaries"]
    assert summary["seq"] == run.compaction_event.seq
    assert summary["compactionId"] == str(run.pk)
    assert story["compaction"]["id"] == str(run.pk)
    assert story["fit"]["how"] == "compacted" and story["fitted"] is True
    forwarded = json.dumps(upstream.requests[-1].body["messages"])
    for message in messages:
        if message["fate"] == "kept":
            assert json.dumps(message["content"])[1:-1][:60] in forwarded
    # The context as sent and as forwarded, against the window.
    context = story["context"]
    assert context["forwardedTokens"] < context["sentTokens"]
    assert context["limit"] == Session.objects.get(pk=session.pk).context_limit
    # The reply, usage by kind, the latency split.
    assert story["reply"][0]["content"] == "All good."
    usage = story["usage"]
    assert usage["tokens"]["cacheRead"] == 100 and usage["tokens"]["input"] == 200
    assert usage["costUsd"]["total"] == pytest.approx(story["costUsd"])
    latency = story["latency"]
    assert latency["gatewayMs"] is not None and latency["totalMs"] >= latency["gatewayMs"]
    assert story["neighbours"]["previous"] == str(before.pk)
    assert story["neighbours"]["next"] is None

    # The call before the compaction forwarded everything as sent, although those messages
    # are folded now: the story is the ledger as it stood at that call.
    earlier = api.get(f"/api/v1/calls/{before.pk}").json()
    assert {m["fate"] for m in earlier["request"]["messages"]} == {"kept"}
    assert earlier["compaction"] is None and earlier["request"]["summaries"] == []
    assert earlier["neighbours"]["next"] == str(compacting.pk)

    # Headers: kept masked, no key anywhere.
    text = json.dumps(story)
    assert token_for(alice) not in text
    request_headers = story["headers"]["request"]
    assert request_headers["x-ledger-key"] == "••••••"
    assert request_headers["authorization"] == "Bearer ••••••"
    assert request_headers["x-ledger-session"] == "story"
    assert story["headers"]["response"]["x-ledger-compacted"] == "true"
    stored = json.dumps(Call.objects.get(pk=compacting.pk).headers)
    assert token_for(alice) not in stored and "sk-" not in stored

    # Same permissions as the session.
    assert _api(bob).get(f"/api/v1/calls/{compacting.pk}").status_code == 404
    assert _api(bob).get("/api/v1/calls/not-a-uuid").status_code == 404


def test_it_follows_an_edited_history_not_the_branch_it_left(gateway_url, upstream, alice):
    client = openai_client(gateway_url, key=token_for(alice), session="edited")
    history = [SYSTEM]
    _converse(client, history, 3)
    # The client edits its second question and goes on from there.
    edited = history[:3] + [{"role": "user", "content": "Something else entirely."}]
    client.chat.completions.create(model="gpt-4o", messages=edited)
    calls = _calls("edited")
    story = _api(alice).get(f"/api/v1/calls/{calls[-1].pk}").json()
    sent = [m["content"] for m in story["request"]["messages"]]
    assert sent == [m["content"] for m in edited]
    assert story["request"]["unmapped"] == 0
    # A retry of the same request tells the same story.
    client.chat.completions.create(model="gpt-4o", messages=edited)
    retried = _calls("edited")[-1]
    again = _api(alice).get(f"/api/v1/calls/{retried.pk}").json()
    assert [m["content"] for m in again["request"]["messages"]] == sent
    assert wait_until(lambda: Event.objects.filter(session=retried.session).exists())
