"""Client-supplied event ids: an identical retry returns the stored event, a different body or
an id stored elsewhere is a 409 `idempotency_conflict` that stores nothing."""

from __future__ import annotations

import uuid

import pytest

from sessions_app.models import Event, Session
from tests.support.helpers import run_threads

SESSIONS = "/api/v1/sessions"
BODY = {
    "type": "TOOL_CALL",
    "content": [{"type": "text", "text": "ls -la"}],
    "name": "shell",
    "toolCallId": "call-1",
    "tokenUsage": {"promptTokens": 7, "completionTokens": 1, "totalTokens": 8},
    "metadata": {"source": "agent", "attempt": 1, "tags": ["a", "b"]},
}


@pytest.fixture
def session_id(alice_api):
    response = alice_api.post(
        SESSIONS,
        {"model": "gpt-4o", "systemPrompt": "sys", "settings": {"autoCompact": False}},
        format="json",
    )
    assert response.status_code == 201
    return response.json()["id"]


def url(session_id):
    return f"{SESSIONS}/{session_id}/events"


def state(session_id):
    row = Session.objects.filter(pk=session_id).values().get()
    row.pop("updated_at")
    return row, list(Event.objects.filter(session_id=session_id).order_by("seq").values())


def assert_conflict(response):
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["error"] == "idempotency_conflict"
    assert body["detail"]
    return body


@pytest.fixture
def stored(alice_api, session_id):
    """BODY stored once under a client id; returns (id, the 201 response body)."""
    event_id = str(uuid.uuid4())
    first = alice_api.post(url(session_id), {"id": event_id, **BODY}, format="json")
    assert first.status_code == 201, first.content
    return event_id, first.json()


def test_it_returns_the_stored_event_for_an_identical_retry(alice_api, session_id, stored):
    event_id, first = stored
    before = state(session_id)
    retry = alice_api.post(url(session_id), {"id": event_id, **BODY}, format="json")
    assert retry.status_code == 200
    assert retry.json() == first
    bulk = alice_api.post(url(session_id), [{"id": event_id, **BODY}], format="json")
    assert (bulk.status_code, bulk.json()) == (200, [first])
    assert state(session_id) == before


def test_it_takes_a_retry_without_the_total_for_the_same_event(alice_api, session_id, stored):
    # A total left out is prompt + completion: 7 + 1 is the stored 8.
    event_id, first = stored
    before = state(session_id)
    usage = {"promptTokens": 7, "completionTokens": 1}
    body = {"id": event_id, **BODY, "tokenUsage": usage}
    retry = alice_api.post(url(session_id), body, format="json")
    assert retry.status_code == 200, retry.content
    assert retry.json() == first
    assert state(session_id) == before


@pytest.mark.parametrize(
    "change",
    [
        {"type": "AGENT_MESSAGE"},
        {"content": "ls -la"},
        {"content": [{"type": "text", "text": "ls -l"}]},
        {"content": '[{"type":"text","text":"ls -la"}]'},
        {"name": "bash"},
        {"toolCallId": "call-2"},
        {"tokenUsage": {"promptTokens": 7, "completionTokens": 1, "totalTokens": 9}},
        {"tokenUsage": {"promptTokens": 7, "completionTokens": 2}},
        {"tokenUsage": None},
        {"metadata": {"source": "agent", "attempt": 2, "tags": ["a", "b"]}},
        {"metadata": {"source": "agent", "attempt": True, "tags": ["a", "b"]}},
        {"metadata": {"source": "agent", "attempt": 1.0, "tags": ["a", "b"]}},
        {"metadata": {}},
    ],
    ids=lambda change: "-".join(f"{k}={v!r}"[:30] for k, v in change.items()),
)
def test_it_refuses_a_retry_with_a_different_body(alice_api, session_id, stored, change):
    event_id, _ = stored
    before = state(session_id)
    body = {"id": event_id, **BODY, **change}
    assert_conflict(alice_api.post(url(session_id), body, format="json"))
    assert_conflict(alice_api.post(url(session_id), [body], format="json"))
    assert state(session_id) == before


def test_it_treats_metadata_key_order_and_pinned_as_the_same_body(alice_api, session_id, stored):
    event_id, first = stored
    # pinned is state a PATCH may change after the first append, so it is not compared.
    body = {
        "id": event_id,
        **BODY,
        "metadata": {"tags": ["a", "b"], "attempt": 1, "source": "agent"},
        "pinned": True,
    }
    retry = alice_api.post(url(session_id), body, format="json")
    assert retry.status_code == 200
    assert retry.json() == first


def test_it_refuses_a_bulk_whose_retried_event_changed_and_stores_none_of_it(
    alice_api, session_id, stored
):
    event_id, _ = stored
    before = state(session_id)
    bulk = [
        {"type": "USER_MESSAGE", "content": "new one"},
        {"id": event_id, **BODY, "content": "changed"},
        {"id": str(uuid.uuid4()), "type": "AGENT_MESSAGE", "content": "new two"},
    ]
    assert_conflict(alice_api.post(url(session_id), bulk, format="json"))
    assert state(session_id) == before


def test_it_answers_another_users_event_id_like_a_different_body(
    alice_api, bob_api, session_id, stored
):
    event_id, _ = stored
    bobs = bob_api.post(SESSIONS, {"model": "gpt-4o"}, format="json").json()["id"]
    before = state(bobs)
    foreign = assert_conflict(bob_api.post(url(bobs), {"id": event_id, **BODY}, format="json"))
    changed = assert_conflict(
        alice_api.post(url(session_id), {"id": event_id, **BODY, "name": "x"}, format="json")
    )
    # The same words either way: nothing tells bob that the id is someone else's.
    assert foreign == changed
    assert "alice" not in str(foreign) and session_id not in str(foreign)
    assert state(bobs) == before


def test_it_replays_a_bulk_of_thousands_and_stores_only_new_events(alice_api, session_id):
    bulk = [
        {
            "id": str(uuid.uuid4()),
            "type": "USER_MESSAGE" if i % 2 else "AGENT_MESSAGE",
            "content": f"message {i} " + "word " * (i % 11),
            "tokenUsage": {"totalTokens": i} if i % 2 == 0 else None,
            "metadata": {"i": i},
        }
        for i in range(3000)
    ]
    first = alice_api.post(url(session_id), bulk, format="json")
    assert first.status_code == 201
    before = state(session_id)
    retry = alice_api.post(url(session_id), bulk, format="json")
    assert retry.status_code == 200
    assert retry.json() == first.json()
    assert state(session_id) == before
    # A retry that adds new events stores only those, after the existing ones.
    extra = [{"id": str(uuid.uuid4()), "type": "USER_MESSAGE", "content": "late"}]
    grown = alice_api.post(url(session_id), bulk + extra, format="json")
    assert grown.status_code == 201
    assert grown.json()[:3000] == first.json()
    assert grown.json()[3000]["seq"] == 3002
    assert Session.objects.get(pk=session_id).event_count == 3002


@pytest.mark.django_db(transaction=True)
def test_it_stores_one_copy_under_concurrent_identical_and_conflicting_retries(alice):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    key = Token.objects.create(user=alice).key

    def client():
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return api

    session = client().post(SESSIONS, {"model": "gpt-4o"}, format="json").json()["id"]
    bulk = [
        {"id": str(uuid.uuid4()), "type": "USER_MESSAGE", "content": f"m{i}"} for i in range(50)
    ]
    outcomes: list[tuple[int, int, object]] = []

    def work(thread):
        # Six threads send the same bulk, two send it with one event changed.
        body = [dict(item) for item in bulk]
        if thread >= 6:
            body[25]["content"] = f"changed by {thread}"
        response = client().post(url(session), body, format="json")
        outcomes.append((thread, response.status_code, response.json()))

    errors = run_threads(8, work)
    assert not errors, errors
    statuses = {thread: status for thread, status, _ in outcomes}
    identical = sorted(statuses[t] for t in range(6))
    stored_seqs = [e.seq for e in Event.objects.filter(session_id=session).order_by("seq")]
    assert stored_seqs == list(range(1, 51))
    if all(statuses[t] == 409 for t in (6, 7)):
        # The original body won: one identical sender stored it, the rest replayed it.
        assert identical == [200] * 5 + [201]
        assert Event.objects.get(pk=bulk[25]["id"]).content == "m25"
    else:
        # A changed body won the race: then every other sender conflicts with it.
        winner = next(t for t in (6, 7) if statuses[t] == 201)
        assert sorted(statuses.values()) == [201] + [409] * 7
        assert Event.objects.get(pk=bulk[25]["id"]).content == f"changed by {winner}"
    for _, status, body in outcomes:
        if status == 409:
            assert body["error"] == "idempotency_conflict"
    session_row = Session.objects.get(pk=session)
    assert (session_row.event_count, session_row.last_seq) == (50, 50)
