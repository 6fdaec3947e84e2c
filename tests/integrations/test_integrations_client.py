"""The Python client (`compaction_app.integrations.client`) against a live server: real HTTP,
a real websocket, a real Celery worker thread running the compactions it starts."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from compaction_app.integrations.client import (
    AsyncClient,
    Client,
    Compaction,
    Event,
    LedgerError,
    Session,
    Usage,
)
from tests.support.helpers import closed_port
from tests.support.live_ledger import live_ledger

pytestmark = pytest.mark.profile_independent

TURNS = [
    {"type": "USER_MESSAGE", "content": f"Please fix bug #{n} in src/app_{n}.py now."}
    for n in range(6)
] + [{"type": "AGENT_MESSAGE", "content": f"Fixed src/app_{n}.py; tests pass."} for n in range(6)]


@pytest.fixture(scope="module")
def live():
    with live_ledger() as server:
        yield server


@pytest.fixture
def alice_client(live):
    with Client(live.base_url, live.tokens["alice"], backoff=0.05) as client:
        yield client


def _session(client: Client, **kwargs) -> Session:
    return client.create_session(
        model="gpt-4o",
        context_limit=4000,
        system_prompt="You are a coding agent.",
        settings={"autoCompact": False, "keepRecentEvents": 1},
        **kwargs,
    )


def test_it_creates_reads_lists_updates_and_deletes_sessions(alice_client):
    session = _session(alice_client, title="client test")
    assert isinstance(session, Session)
    assert session.model == "gpt-4o" and session.context_limit == 4000
    assert alice_client.get_session(session.id) == session
    assert session.id in [s.id for s in alice_client.list_sessions()]
    renamed = alice_client.update_session(session.id, title="renamed")
    assert renamed.title == "renamed"
    alice_client.delete_session(session.id)
    with pytest.raises(LedgerError) as caught:
        alice_client.get_session(session.id)
    assert caught.value.code == "not_found" and caught.value.status == 404


def test_it_appends_single_and_bulk_events_and_a_retry_stores_nothing_twice(alice_client):
    session = _session(alice_client)
    first = alice_client.append(session.id, {"type": "USER_MESSAGE", "content": "Hello there."})
    assert isinstance(first, Event) and first.seq == 2 and first.token_count > 0
    event_id = str(uuid.uuid4())
    call = {
        "id": event_id,
        "type": "TOOL_CALL",
        "name": "read_file",
        "tool_call_id": "c1",
        "content": '{"path": "a.py"}',
    }
    bulk = alice_client.append_many(
        session.id,
        [call, {"type": "TOOL_RESULT", "toolCallId": "c1", "name": "read_file", "content": "x=1"}],
    )
    assert [e.seq for e in bulk] == [3, 4]
    assert bulk[0].id == event_id and bulk[0].tool_call_id == "c1"
    # The same client-supplied id again (a retried request) returns the stored event.
    again = alice_client.append(session.id, call)
    assert again.id == event_id and again.seq == 3
    assert [e.seq for e in alice_client.events(session.id)] == [1, 2, 3, 4]


def test_it_raises_one_error_class_carrying_the_api_error_code(live, alice_client):
    with pytest.raises(LedgerError) as unknown:
        alice_client.create_session(model="no-such-model-xyz")
    assert unknown.value.status == 400 and unknown.value.code
    session = _session(alice_client)
    with pytest.raises(LedgerError) as invalid:
        alice_client.append(session.id, {"type": "NOT_A_TYPE", "content": "one"})
    assert invalid.value.status == 400 and "type" in str(invalid.value.body)
    assert alice_client.events(session.id)[-1].seq == 1  # nothing stored
    with (
        Client(live.base_url, live.tokens["bob"]) as bob_client,
        pytest.raises(LedgerError) as hidden,
    ):
        bob_client.usage(session.id)
    assert hidden.value.code == "not_found"
    with Client(live.base_url, "not-a-token") as anonymous, pytest.raises(LedgerError) as refused:
        anonymous.list_sessions()
    assert refused.value.status == 401


def test_it_reports_a_dead_server_as_a_connection_error():
    client = Client(f"http://127.0.0.1:{closed_port()}", "t", retries=1, backoff=0.01)
    with pytest.raises(LedgerError) as caught:
        client.list_sessions()
    assert caught.value.code == "connection_error"


def test_it_reads_usage_and_context(alice_client):
    session = _session(alice_client)
    alice_client.append_many(session.id, TURNS)
    usage = alice_client.usage(session.id)
    assert isinstance(usage, Usage)
    assert usage.context_limit == 4000 and usage.exact is True
    context = alice_client.context(session.id)
    assert context.token_count == usage.context_tokens
    assert context.messages[0]["role"] == "system"
    anthropic = alice_client.context(session.id, format="anthropic")
    assert anthropic.system == "You are a coding agent."


def test_it_starts_waits_for_and_reverts_a_compaction(alice_client):
    session = _session(alice_client)
    alice_client.append_many(session.id, TURNS)
    before = alice_client.usage(session.id).context_tokens
    plan = alice_client.plan_compaction(session.id, strategy="summarize")
    assert plan["dryRun"] is True and plan["tokensBefore"] == before
    assert alice_client.compactions(session.id) == []  # a dry run changes nothing
    started = alice_client.start_compaction(session.id, strategy="summarize")
    assert isinstance(started, Compaction) and started.status == "pending"
    run = alice_client.wait_compaction(started.id, timeout=60)
    assert run.status == "completed", run.error
    assert run.tokens_before == before
    assert alice_client.usage(session.id).context_tokens == run.tokens_after
    assert alice_client.summary(session.id).summary
    assert [c.id for c in alice_client.compactions(session.id)] == [run.id]
    reverted = alice_client.revert_compaction(run.id)
    assert reverted.id == run.id
    assert alice_client.usage(session.id).context_tokens == before


def test_it_async_client_covers_the_same_calls(live):
    async def scenario() -> None:
        async with AsyncClient(live.base_url, live.tokens["alice"]) as client:
            session = await client.create_session(
                model="gpt-4o", context_limit=4000, settings={"autoCompact": False}
            )
            events = await client.append_many(session.id, TURNS)
            assert [e.seq for e in events] == list(range(1, len(TURNS) + 1))
            single = await client.append(session.id, {"type": "USER_MESSAGE", "content": "x"})
            assert single.seq == len(TURNS) + 1
            assert (await client.usage(session.id)).context_tokens > 0
            assert (await client.context(session.id)).messages
            run = await client.start_compaction(session.id, strategy="trim", target_ratio=0.01)
            finished = await client.wait_compaction(run.id, timeout=60)
            assert finished.status == "completed"
            await client.revert_compaction(run.id)
            assert session.id in [s.id for s in await client.list_sessions()]
            assert (await client.update_session(session.id, title="async")).title == "async"
            await client.delete_session(session.id)
            with pytest.raises(LedgerError) as caught:
                await client.get_session(session.id)
            assert caught.value.code == "not_found"

    asyncio.run(scenario())


def test_it_watches_a_sessions_websocket_messages(live, alice_client):
    session = _session(alice_client)
    alice_client.append_many(session.id, TURNS)

    async def scenario() -> list[dict]:
        seen: list[dict] = []
        async with AsyncClient(live.base_url, live.tokens["alice"]) as client:
            stream = client.watch(session.id)
            first = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0.5)  # the subscription is in place before the run starts
            run = await client.start_compaction(session.id, strategy="summarize")
            seen.append(await asyncio.wait_for(first, 30))
            while seen[-1]["type"] != "COMPACTION_COMPLETE":
                seen.append(await asyncio.wait_for(stream.__anext__(), 30))
            await stream.aclose()
            assert seen[-1]["compactionId"] == run.id
        return seen

    seen = asyncio.run(scenario())
    types = [m["type"] for m in seen]
    assert "COMPACTION_START" in types and types[-1] == "COMPACTION_COMPLETE"
    assert seen[-1]["success"] is True and seen[-1]["sessionId"] == session.id


def test_it_refuses_to_watch_another_users_session(live, alice_client):
    session = _session(alice_client)

    async def scenario() -> None:
        stream = Client(live.base_url, live.tokens["bob"]).watch(session.id)
        with pytest.raises(LedgerError) as caught:
            await asyncio.wait_for(stream.__anext__(), 10)
        assert caught.value.code in ("websocket_refused", "websocket_closed")

    asyncio.run(scenario())


def test_it_searches_and_recalls_when_the_server_offers_them(alice_client):
    session = _session(alice_client)
    alice_client.append_many(session.id, TURNS)
    try:
        hits = alice_client.search(session.id, "app_3")
    except LedgerError as exc:
        if exc.status == 404:
            pytest.skip("this server has no /search endpoint yet (issue: search/recall)")
        raise
    assert any("app_3" in hit.snippet or "app_3" in str(hit.raw) for hit in hits)
    recalled = alice_client.recall(session.id, "app_3", max_tokens=500)
    assert recalled.messages and recalled.token_count <= 500
