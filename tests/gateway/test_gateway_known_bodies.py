"""A conversation's next call reads only what it adds (gateway/body.py, KnownBodies), through
the gateway as clients call it: the same events, the same refusals, no caller reading from
another's bodies."""

from __future__ import annotations

import httpx
import pytest

from compaction_app.gateway import views
from sessions_app.models import Event, Session, Thread
from tests.support.gateway_live import CANARY, token_for

CHAT = "/gateway/openai/v1/chat/completions"
MESSAGES = "/gateway/anthropic/v1/messages"
GEMINI = "/gateway/gemini/v1beta/models/gemini-2.5-pro:generateContent"

pytestmark = pytest.mark.django_db(transaction=True)


def _history(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a terse coding agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Step {turn}: run the tests [x] {{y}}"})
        messages.append({"role": "assistant", "content": f"Re: step {turn}"})
    return messages


def _chat(gateway_url: str, key: str, session: str, messages: list, **more) -> httpx.Response:
    return httpx.post(
        gateway_url + CHAT,
        json={"model": "gpt-4o", "messages": messages, **more},
        headers={
            "Authorization": f"Bearer {CANARY}",
            "X-Ledger-Key": key,
            "X-Ledger-Session": session,
        },
        timeout=30,
    )


def test_it_reads_only_what_a_conversation_adds_and_records_the_same(gateway_url, upstream, alice):
    key = token_for(alice)
    history = _history(3)
    for turn in range(3):
        history = history + [{"role": "user", "content": f"And now {turn}?"}]
        response = _chat(gateway_url, key, "known", history, stream=False)
        assert response.status_code == 200, response.text
        history = history + [response.json()["choices"][0]["message"]]
        history[-1] = {"role": "assistant", "content": history[-1]["content"]}
    # The first call was read whole; the next two from the one before.
    assert (views.KNOWN_BODIES.hits, views.KNOWN_BODIES.misses) == (2, 0)
    session = Session.objects.get(owner=alice)
    texts = list(
        Event.objects.filter(session=session).order_by("seq").values_list("content", flat=True)
    )
    # Every message once, in order: the system prompt, the history, three questions and
    # three replies (as recorded when every body was read whole).
    assert len(texts) == len(history)
    assert texts == [message["content"] for message in history]


def test_it_still_checks_what_was_added(gateway_url, upstream, alice):
    key = token_for(alice)
    history = _history(2)
    assert _chat(gateway_url, key, "checked", history).status_code == 200
    bad = history + [{"role": "assistant", "content": "Re: step 1"}, {"role": "wizard"}]
    response = _chat(gateway_url, key, "checked", bad)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == f"messages[{len(bad) - 1}].role"
    assert views.KNOWN_BODIES.hits == 1


def test_it_reads_a_changed_history_from_the_first_change(gateway_url, upstream, alice):
    # A client that rewrote an earlier message: the body is read from the message end before
    # the first change (issue 42's slow path), and the rewritten message is checked like any
    # other.
    key = token_for(alice)
    history = _history(2)
    assert _chat(gateway_url, key, "edited", history).status_code == 200
    edited = [history[0], {"role": "wizard", "content": "x"}, *history[2:]]
    response = _chat(gateway_url, key, "edited", edited)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[1].role"
    assert views.KNOWN_BODIES.hits == 1


def test_it_records_a_retry_and_an_edited_history_as_reading_them_whole_does(
    gateway_url, upstream, alice
):
    """A retry (the same body again) and a history whose old tool results were cleared are
    read from what the conversation's last body held, and matched to its thread without
    going through every message: nothing is recorded twice, the reply recorded first stands,
    the edited history continues its thread."""
    key = token_for(alice)
    history = _history(4)
    first = _chat(gateway_url, key, "slow", history)
    assert first.status_code == 200
    session = Session.objects.get(owner=alice, client_key="slow")
    count = Event.objects.filter(session=session).count()
    retried = _chat(gateway_url, key, "slow", history)
    assert retried.status_code == 200
    assert Event.objects.filter(session=session).count() == count
    thread = Thread.objects.get(session=session)
    assert thread.length == len(history) + 1 and thread.request_chain
    # The client edits its history (clears an old message) and goes on.
    reply = {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]}
    edited = [*history, reply, {"role": "user", "content": "next"}]
    edited[3] = {**edited[3], "content": "[Old tool result content cleared]"}
    assert _chat(gateway_url, key, "slow", edited).status_code == 200
    assert Thread.objects.filter(session=session).count() == 1
    stored = list(Event.objects.filter(session=session).order_by("seq"))
    assert len(stored) == count + 2  # the new question and its reply, nothing else
    assert views.KNOWN_BODIES.hits == 2


def test_it_never_reads_from_another_callers_bodies(gateway_url, upstream, alice, bob):
    history = _history(2)
    assert _chat(gateway_url, token_for(alice), "same-name", history).status_code == 200
    assert _chat(gateway_url, token_for(bob), "same-name", history).status_code == 200
    assert views.KNOWN_BODIES.hits == 0
    # Nor from a call that was refused: a wrong key keeps nothing.
    response = _chat(gateway_url, "not-a-key", "same-name", history)
    assert response.status_code == 401
    assert len(list(views.KNOWN_BODIES)) == 2


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        (
            MESSAGES,
            {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "Be terse."},
            {"x-api-key": CANARY, "anthropic-version": "2023-06-01"},
        ),
        (
            GEMINI,
            {"systemInstruction": {"parts": [{"text": "Be terse."}]}},
            {"x-goog-api-key": CANARY},
        ),
    ],
)
def test_it_reads_only_what_is_added_on_every_wire(
    gateway_url, upstream, alice, path, body, headers
):
    key = token_for(alice)
    param = "contents" if path == GEMINI else "messages"

    def turn(text: str, role: str) -> dict:
        if path == GEMINI:
            return {"role": "model" if role == "assistant" else "user", "parts": [{"text": text}]}
        return {"role": role, "content": text}

    items = [turn("Run the tests.", "user"), turn("Re: Run the tests.", "assistant")]
    sent = {"X-Ledger-Key": key, "X-Ledger-Session": f"wire-{param}", **headers}
    for number in range(3):
        items = items + [turn(f"Question {number}", "user")]
        response = httpx.post(
            gateway_url + path, json={param: items, **body}, headers=sent, timeout=30
        )
        assert response.status_code == 200, response.text
        items = items + [turn(f"Re: Question {number}", "assistant")]
    assert views.KNOWN_BODIES.hits == 2
