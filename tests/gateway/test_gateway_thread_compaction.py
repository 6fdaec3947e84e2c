"""Compaction per thread (docs/fitting.md): a run the gateway starts for one thread plans over
that thread's events alone, folds only them and writes its summary into that thread; the
session's usage on the dashboard and in USAGE_UPDATED is its main thread's, as REST /usage."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from compaction_app import services
from compaction_app.gateway import after
from compaction_app.models import CompactionRun, RunStatus, Trigger
from sessions_app.models import Event, Session, Thread
from sessions_app.services import session_update
from sessions_app.threads import main_thread
from tests.support.gateway_live import openai_client, token_for
from tests.support.helpers import api_token, ws_communicator

pytestmark = pytest.mark.django_db(transaction=True)

MAIN_SYSTEM = {"role": "system", "content": "You are a coding agent."}
SIDE_SYSTEM = {"role": "system", "content": "You review pull requests for style."}


def _converse(client, history, words: str, turns: int) -> None:
    for turn in range(turns):
        history.append({"role": "user", "content": f"{words} {turn}. " * 30})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})


def _two_threads(gateway_url, alice, name: str):
    """A main loop and a side thread of 10 turns each, the window nearly full for both."""
    main_client = openai_client(gateway_url, key=token_for(alice), session=name)
    side_client = openai_client(gateway_url, key=token_for(alice), session=name)
    main, side = [MAIN_SYSTEM], [SIDE_SYSTEM]
    _converse(main_client, main, "Please fix bug", 10)
    _converse(side_client, side, "Please review file", 10)
    after.wait_idle()
    session = Session.objects.get(client_key=name)
    session = session_update(session=session, settings={"autoCompact": False})
    largest = max(Thread.objects.filter(session=session).values_list("context_tokens", flat=True))
    session_update(session=session, context_limit=int(largest / 0.85))
    main_key = main_thread(session=session).key
    side_key = Thread.objects.filter(session=session).exclude(key=main_key).get().key
    return session, (main_client, main, main_key), (side_client, side, side_key)


def _text(messages) -> str:
    return "\n".join(str(message["content"]) for message in messages)


def _thread_events(session, key):
    return Event.objects.filter(session=session, metadata__thread=key)


def test_it_compacts_a_thread_without_folding_another_threads_events(gateway_url, upstream, alice):
    session, (main_client, main, main_key), (side_client, side, side_key) = _two_threads(
        gateway_url, alice, "per-thread"
    )
    main.append({"role": "user", "content": "Status?"})
    main_client.chat.completions.create(model="gpt-4o", messages=main)
    after.wait_idle()
    run = CompactionRun.objects.get(session=session, trigger=Trigger.GATEWAY)
    assert run.status == RunStatus.COMPLETED and run.thread == main_key
    assert run.compaction_event.metadata["thread"] == main_key
    folded = Event.objects.filter(session=session, compacted_by=run.compaction_event)
    assert folded.exists()
    assert set(folded.values_list("metadata__thread", flat=True)) == {main_key}
    assert not _thread_events(session, side_key).filter(compacted_by__isnull=False).exists()
    # What the main thread forwards holds only its own content and its own summary.
    forwarded = _text(upstream.requests[-1].body["messages"])
    assert "Please review file" not in forwarded and SIDE_SYSTEM["content"] not in forwarded
    assert run.compaction_event.content[:40] in forwarded

    # The side thread crosses its own threshold: its run leaves the main thread alone.
    main_folded = set(_thread_events(session, main_key).values_list("pk", "compacted_by_id"))
    side.append({"role": "user", "content": "Anything else?"})
    side_client.chat.completions.create(model="gpt-4o", messages=side)
    after.wait_idle()
    side_run = CompactionRun.objects.filter(session=session, thread=side_key).get()
    assert side_run.status == RunStatus.COMPLETED
    assert set(
        Event.objects.filter(session=session, compacted_by=side_run.compaction_event).values_list(
            "metadata__thread", flat=True
        )
    ) == {side_key}
    assert set(_thread_events(session, main_key).values_list("pk", "compacted_by_id")) == (
        main_folded
    )
    side_forwarded = _text(upstream.requests[-1].body["messages"])
    assert "Please fix bug" not in side_forwarded
    assert run.compaction_event.content[:40] not in side_forwarded

    # The main thread's next request still carries its own summary, not the side thread's.
    main.append({"role": "assistant", "content": "Done."})
    main.append({"role": "user", "content": "Next?"})
    main_client.chat.completions.create(model="gpt-4o", messages=main)
    forwarded = _text(upstream.requests[-1].body["messages"])
    assert run.compaction_event.content[:40] in forwarded
    assert side_run.compaction_event.content[:40] not in forwarded
    assert "Please review file" not in forwarded


def test_it_compacts_the_main_thread_over_rest_by_default_and_a_named_one_on_request(
    gateway_url, upstream, alice, alice_api
):
    session, (_, _, main_key), (_, _, side_key) = _two_threads(gateway_url, alice, "rest-thread")
    url = f"/api/v1/sessions/{session.pk}/compactions"
    dry = alice_api.post(url, {"dryRun": True, "strategy": "trim"}, format="json").json()
    main_ids = {str(pk) for pk in _thread_events(session, main_key).values_list("pk", flat=True)}
    assert dry["eventsToFold"] and set(dry["eventsToFold"]) <= main_ids
    side = alice_api.post(
        url, {"dryRun": True, "strategy": "trim", "thread": side_key}, format="json"
    ).json()
    side_ids = {str(pk) for pk in _thread_events(session, side_key).values_list("pk", flat=True)}
    assert side["eventsToFold"] and set(side["eventsToFold"]) <= side_ids
    unknown = alice_api.post(url, {"strategy": "trim", "thread": "nope"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["error"] == "unknown_thread"
    assert not CompactionRun.objects.filter(session=session).exists()


def test_it_shows_the_main_threads_usage_on_the_dashboard_and_over_the_websocket(
    gateway_url, upstream, alice, alice_api
):
    session, (_, _, main_key), _ = _two_threads(gateway_url, alice, "usage-thread")
    rest = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    assert rest["thread"] == main_key
    assert rest["contextTokens"] != Session.objects.get(pk=session.pk).context_tokens

    client = Client()
    client.force_login(alice)
    html = client.get(f"/sessions/{session.pk}/").content.decode()
    shown = re.search(r'id="ctx-tokens">([\d,]+)<', html).group(1)
    assert int(shown.replace(",", "")) == rest["contextTokens"]

    fresh = Session.objects.get(pk=session.pk)
    token = api_token(alice)

    async def scenario():
        communicator = ws_communicator(f"/ws/sessions/{session.pk}/", token=token)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        await sync_to_async(services.broadcast_usage)(fresh)
        while True:
            message = await communicator.receive_json_from(timeout=5)
            if message["type"] == "USAGE_UPDATED":
                await communicator.disconnect()
                return message["usage"]

    pushed = async_to_sync(scenario)()
    assert pushed["thread"] == main_key
    assert pushed["contextTokens"] == rest["contextTokens"]
    assert pushed["percentUsed"] == rest["percentUsed"]
