"""Threads inside a session: several writers on one `X-Ledger-Session` (a main loop, its side
calls, parallel workers), each call matched to the thread it continues, every reply and its
usage recorded in its own thread, side calls forwarded as sent, the threads listed over REST."""

from __future__ import annotations

import concurrent.futures

import pytest

from compaction_app.gateway import after
from sessions_app.models import Event, Session, Thread
from sessions_app.services import session_update
from tests.support.gateway_live import anthropic_client, openai_client, token_for

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def test_it_records_every_reply_of_concurrent_threads_with_its_usage(gateway_url, upstream, alice):
    # The provider answers every call with the same words: only the history before a reply
    # tells the replies apart.
    client = openai_client(gateway_url, key=token_for(alice), session="many-writers")
    history = [SYSTEM]
    for turn in range(6):
        history.append({"role": "user", "content": f"Main task, step {turn}."})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})

    # The token is read here: a thread of the test's own that touched the database would keep
    # a pooled connection it never gives back.
    key = token_for(alice)

    def worker(number: int) -> list[int]:
        own = openai_client(gateway_url, key=key, session="many-writers")
        conversation = [SYSTEM]
        statuses = []
        for turn in range(3):
            conversation.append({"role": "user", "content": f"Worker {number}, job {turn}."})
            raw = own.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=conversation
            )
            statuses.append(raw.status_code)
            conversation.append(
                {"role": "assistant", "content": raw.parse().choices[0].message.content}
            )
        return statuses

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        statuses = [s for result in pool.map(worker, range(4)) for s in result]
    after.wait_idle()
    assert statuses == [200] * 12

    session = Session.objects.get(client_key="many-writers")
    replies = Event.objects.filter(session=session, type="AGENT_MESSAGE")
    assert replies.count() == 18
    assert all(reply.prompt_tokens for reply in replies)
    # Five threads: the main loop and one per worker, each reply in its caller's thread.
    threads = Thread.objects.filter(session=session)
    assert threads.count() == 5
    per_thread = sorted(replies.filter(metadata__thread=thread.key).count() for thread in threads)
    assert per_thread == [3, 3, 3, 3, 6]
    # Every user turn recorded once.
    assert Event.objects.filter(session=session, type="USER_MESSAGE").count() == 18


def test_it_forwards_a_side_call_as_sent_and_keeps_the_main_thread_apart(
    gateway_url, upstream, alice
):
    client = openai_client(gateway_url, key=token_for(alice), session="side-calls")
    history = [SYSTEM]
    for turn in range(8):
        history.append({"role": "user", "content": f"Please fix bug {turn}. " * 30})
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    session = Session.objects.get(client_key="side-calls")
    session = session_update(session=session, settings={"autoCompact": False})
    # The window is nearly full: the next main-loop call compacts.
    session_update(session=session, context_limit=int(session.context_tokens / 0.85))
    history.append({"role": "user", "content": "Status?"})
    client.chat.completions.create(model="gpt-4o", messages=history)
    main_forwarded = upstream.requests[-1].body
    assert len(main_forwarded["messages"]) < len(history)

    # A side call (its own instructions, one message) on the same session.
    side = [
        {"role": "system", "content": "Write a five-word title for this conversation."},
        {"role": "user", "content": "Please fix bug 0."},
    ]
    client.chat.completions.create(model="gpt-4o", messages=side)
    assert upstream.requests[-1].body["messages"] == side

    # The main loop's next request is its previous one plus its new turns: nothing of the
    # side call in it.
    history.append({"role": "assistant", "content": "Done."})
    history.append({"role": "user", "content": "Next?"})
    client.chat.completions.create(model="gpt-4o", messages=history)
    forwarded = upstream.requests[-1].body["messages"]
    assert forwarded[: len(main_forwarded["messages"])] == main_forwarded["messages"]
    assert forwarded[-2:] == history[-2:]
    assert "five-word title" not in str(forwarded)
    after.wait_idle()
    keys = set(Thread.objects.filter(session=session).values_list("key", flat=True))
    assert len(keys) == 2


def test_it_names_a_thread_from_the_header_and_lists_threads_over_rest(
    gateway_url, upstream, alice, alice_api, bob_api
):
    client = anthropic_client(
        gateway_url, key=token_for(alice), session="named", **{"X-Ledger-Thread": "main"}
    )
    client.messages.create(
        model="claude-3-5-sonnet-latest",
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    side = anthropic_client(gateway_url, key=token_for(alice), session="named")
    side.messages.create(
        model="claude-3-5-sonnet-latest",
        max_tokens=20,
        system="Title this.",
        messages=[{"role": "user", "content": "Hello"}],
    )
    after.wait_idle()
    session = Session.objects.get(client_key="named")
    listed = alice_api.get(f"/api/v1/sessions/{session.pk}/threads").json()
    assert [t["key"] for t in listed["results"]][0] == "main"
    assert listed["results"][0]["main"] is True
    assert len(listed["results"]) == 2
    events = alice_api.get(f"/api/v1/sessions/{session.pk}/events?thread=main").json()
    contents = [e["content"] for e in events["results"]]
    assert "Be brief." in contents and "Title this." not in contents
    # The scope rule: the context figures are the main thread's (each thread has its own),
    # the bill is the whole session's whichever thread is asked for.
    usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage").json()
    assert usage["thread"] == "main" and usage["scope"]["thread"] == "main"
    threads = {t.key: t for t in Thread.objects.filter(session=session)}
    assert usage["contextTokens"] == threads["main"].context_tokens
    assert usage["totalCompletionTokens"] == sum(t.completion_tokens for t in threads.values())
    assert usage["calls"] == 2
    side_key = listed["results"][1]["key"]
    side_usage = alice_api.get(f"/api/v1/sessions/{session.pk}/usage?thread={side_key}").json()
    assert side_usage["thread"] == side_key
    assert side_usage["contextTokens"] == listed["results"][1]["contextTokens"] > 0
    bill = ("totalPromptTokens", "totalCompletionTokens", "totalTokens", "costUsd", "calls")
    assert {k: side_usage[k] for k in bill} == {k: usage[k] for k in bill}
    assert side_usage["threadBill"] == {
        "thread": side_key,
        "calls": 1,
        "promptTokens": threads[side_key].prompt_tokens,
        "completionTokens": threads[side_key].completion_tokens,
        "totalTokens": threads[side_key].prompt_tokens + threads[side_key].completion_tokens,
    }
    assert bob_api.get(f"/api/v1/sessions/{session.pk}/threads").status_code == 404


def test_it_shows_threads_on_the_session_page_main_first_and_bookkeeping_failures(
    gateway_url, upstream, alice, client, monkeypatch
):
    from compaction_app.gateway import record

    api = openai_client(gateway_url, key=token_for(alice), session="page-threads")
    api.chat.completions.create(model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": "A"}])
    api.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "system", "content": "Title it."}, {"role": "user", "content": "A"}],
    )

    # The reply's bookkeeping breaks: the call still answers 200, the page says so.
    def broken(**kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(record, "record_reply", broken)
    monkeypatch.setattr("compaction_app.gateway.thread_fit.record_reply", broken)
    raw = api.chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=[SYSTEM, {"role": "user", "content": "A"}, {"role": "assistant", "content": "x"}],
    )
    assert raw.status_code == 200
    after.wait_idle()
    session = Session.objects.get(client_key="page-threads")
    client.force_login(alice)
    page = client.get(f"/sessions/{session.pk}/").content.decode()
    assert 'id="threads"' in page
    assert "side thread" in page
    assert "recording a reply failed: RuntimeError" in page


def test_it_adds_up_a_threads_counters_over_concurrent_calls_and_retries(
    gateway_url, upstream, alice
):
    # The thread's row is updated inside each reply's append: concurrent calls of one thread
    # still add up, and a retry (its reply already stored: the append's careful way) still
    # counts as a call.
    key = token_for(alice)  # here, not in the calling threads (see the test above)

    def call(number: int):
        own = openai_client(
            gateway_url, key=key, session="shared-thread", **{"X-Ledger-Thread": "w"}
        )
        return own.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": f"Job {number}."}]
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(call, range(8)))
    retried = call(3)
    after.wait_idle()
    thread = Thread.objects.get(session__client_key="shared-thread", key="w")
    assert thread.calls == 9
    assert thread.completion_tokens == sum(r.usage.completion_tokens for r in [*replies, retried])
    assert thread.prompt_tokens == sum(r.usage.prompt_tokens for r in [*replies, retried])
    session = Session.objects.get(client_key="shared-thread")
    assert Event.objects.filter(session=session, type="AGENT_MESSAGE").count() == 8
