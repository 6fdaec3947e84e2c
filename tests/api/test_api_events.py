"""Events over the REST API: append (single, bulk, idempotent), pinning and cursor pagination."""

from __future__ import annotations

import json
import uuid

import pytest

from sessions_app import tokens
from sessions_app.models import Event, EventType, Session

SESSIONS = "/api/v1/sessions"


@pytest.fixture
def session(alice_api):
    response = alice_api.post(
        SESSIONS,
        {
            "model": "gpt-4o",
            "systemPrompt": "You are a careful agent.",
            "settings": {"autoCompact": False},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


def events_url(session):
    return f"{SESSIONS}/{session['id']}/events"


def snapshot(api, session):
    """What a client can observe of a session: its usage document and its stored events."""
    usage = api.get(f"{SESSIONS}/{session['id']}/usage").json()
    stored = list(
        Event.objects.filter(session_id=session["id"])
        .order_by("seq")
        .values_list("id", "seq", "type", "content", "pinned")
    )
    row = Session.objects.filter(pk=session["id"]).values().get()
    row.pop("updated_at")
    return usage, stored, row


def test_it_appends_a_single_event(alice_api, session):
    response = alice_api.post(
        events_url(session), {"type": "USER_MESSAGE", "content": "hello"}, format="json"
    )
    assert response.status_code == 201, response.json()
    event = response.json()
    assert event["seq"] == 2
    assert event["type"] == "USER_MESSAGE"
    assert event["role"] == "user"
    assert event["content"] == "hello"
    assert event["sessionId"] == session["id"]
    uuid.UUID(event["id"])
    counter = tokens.counter_for_model("gpt-4o")
    assert event["tokenCount"] == tokens.message_tokens(counter, role="user", content="hello")
    assert event["tokenUsage"] is None
    assert event["pinned"] is False
    assert event["compactedBy"] is None


def test_it_appends_a_bulk_list_in_order(alice_api, session):
    body = [
        {"type": "USER_MESSAGE", "content": "list files"},
        {"type": "TOOL_CALL", "name": "ls", "toolCallId": "call_1", "content": '{"path": "."}'},
        {"type": "TOOL_RESULT", "toolCallId": "call_1", "name": "ls", "content": "a.py\nb.py"},
        {
            "type": "AGENT_MESSAGE",
            "content": "Two files.",
            "tokenUsage": {"promptTokens": 50, "completionTokens": 4, "totalTokens": 54},
        },
        {"type": "LOCAL_SYSTEM_MESSAGE", "content": "shown to people only"},
        {"type": "USER_MESSAGE", "content": [{"type": "text", "text": "structured"}]},
    ]
    response = alice_api.post(events_url(session), body, format="json")
    assert response.status_code == 201, response.json()
    stored = response.json()
    assert [e["seq"] for e in stored] == [2, 3, 4, 5, 6, 7]
    assert [e["type"] for e in stored] == [b["type"] for b in body]
    assert stored[1]["name"] == "ls"
    assert stored[1]["toolCallId"] == "call_1"
    assert stored[3]["tokenUsage"] == {"promptTokens": 50, "completionTokens": 4, "totalTokens": 54}
    assert stored[5]["content"] == [{"type": "text", "text": "structured"}]
    assert list(
        Event.objects.filter(session_id=session["id"]).order_by("seq").values_list("seq", flat=True)
    ) == [1, 2, 3, 4, 5, 6, 7]
    assert Session.objects.get(pk=session["id"]).last_seq == 7


def test_it_stores_nothing_when_one_bulk_event_is_bad(alice_api, session):
    alice_api.post(
        events_url(session), {"type": "USER_MESSAGE", "content": "before"}, format="json"
    )
    before = snapshot(alice_api, session)
    body = [
        {"type": "USER_MESSAGE", "content": "one"},
        {"type": "AGENT_MESSAGE", "content": "two"},
        {"type": "AGENT_MESSAGE", "content": 3},
        {"type": "USER_MESSAGE", "content": "four"},
    ]
    response = alice_api.post(events_url(session), body, format="json")
    assert response.status_code == 400
    error = response.json()
    assert error["error"] == "invalid_request"
    assert "[2].content" in error["fields"]
    assert "[2].content" in error["detail"]
    assert snapshot(alice_api, session) == before


def test_it_stores_nothing_when_a_bulk_event_fails_in_the_service(alice_api, session):
    before = snapshot(alice_api, session)
    body = [
        {"type": "USER_MESSAGE", "content": "fine"},
        {"type": "USER_MESSAGE", "content": "nul\x00byte"},
    ]
    response = alice_api.post(events_url(session), body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_content"
    assert "[1].content" in response.json()["fields"]
    assert snapshot(alice_api, session) == before


def test_it_returns_the_stored_event_on_a_retry(alice_api, session):
    event_id = str(uuid.uuid4())
    body = {
        "id": event_id,
        "type": "AGENT_MESSAGE",
        "content": "done",
        "tokenUsage": {"promptTokens": 7, "completionTokens": 1, "totalTokens": 8},
    }
    first = alice_api.post(events_url(session), body, format="json")
    assert first.status_code == 201
    before = snapshot(alice_api, session)
    retry = alice_api.post(events_url(session), body, format="json")
    assert retry.status_code == 200
    assert retry.json() == first.json()
    assert snapshot(alice_api, session) == before


def test_it_stores_only_the_new_events_of_a_partly_retried_bulk(alice_api, session):
    known = str(uuid.uuid4())
    alice_api.post(
        events_url(session), {"id": known, "type": "USER_MESSAGE", "content": "a"}, format="json"
    )
    response = alice_api.post(
        events_url(session),
        [
            {"id": known, "type": "USER_MESSAGE", "content": "a"},
            {"type": "AGENT_MESSAGE", "content": "b"},
        ],
        format="json",
    )
    assert response.status_code == 201
    assert [e["seq"] for e in response.json()] == [2, 3]
    assert Session.objects.get(pk=session["id"]).event_count == 3


def test_it_refuses_an_id_used_in_another_session(alice_api, session):
    other = alice_api.post(SESSIONS, {"model": "gpt-4o"}, format="json").json()
    event_id = str(uuid.uuid4())
    alice_api.post(
        events_url(session), {"id": event_id, "type": "USER_MESSAGE", "content": "x"}, format="json"
    )
    before = snapshot(alice_api, other)
    response = alice_api.post(
        events_url(other), {"id": event_id, "type": "USER_MESSAGE", "content": "x"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"] == "idempotency_conflict"
    assert response.json()["detail"]
    assert snapshot(alice_api, other) == before


def test_it_refuses_a_repeated_id_within_one_request(alice_api, session):
    event_id = str(uuid.uuid4())
    before = snapshot(alice_api, session)
    response = alice_api.post(
        events_url(session),
        [
            {"id": event_id, "type": "USER_MESSAGE", "content": "x"},
            {"id": event_id, "type": "USER_MESSAGE", "content": "y"},
        ],
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["error"] == "duplicate_id"
    assert "[1].id" in response.json()["fields"]
    assert snapshot(alice_api, session) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "TOOL_CALL", "content": "{}", "toolCallId": "c1"}, "toolCallId"),
        ({"type": "TOOL_CALL", "content": "{}", "name": "ls"}, "toolCallId"),
        ({"type": "TOOL_RESULT", "content": "out"}, "toolCallId"),
    ],
)
def test_it_requires_tool_call_fields(alice_api, session, body, field):
    before = snapshot(alice_api, session)
    response = alice_api.post(events_url(session), body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert field in response.json()["fields"]
    assert snapshot(alice_api, session) == before


def test_it_refuses_compaction_events_from_clients(alice_api, session):
    before = snapshot(alice_api, session)
    response = alice_api.post(
        events_url(session), {"type": "COMPACTION", "content": "my summary"}, format="json"
    )
    assert response.status_code == 400
    assert "type" in response.json()["fields"]
    assert snapshot(alice_api, session) == before


def test_it_pins_and_unpins_an_event(alice_api, session):
    event = alice_api.post(
        events_url(session), {"type": "USER_MESSAGE", "content": "keep me"}, format="json"
    ).json()
    url = f"{events_url(session)}/{event['id']}"
    response = alice_api.patch(url, {"pinned": True}, format="json")
    assert response.status_code == 200
    assert response.json()["pinned"] is True
    assert Event.objects.get(pk=event["id"]).pinned is True
    assert alice_api.get(url).json()["pinned"] is True
    assert alice_api.patch(url, {"pinned": False}, format="json").json()["pinned"] is False
    assert Event.objects.get(pk=event["id"]).pinned is False


def test_it_accepts_pinned_at_append(alice_api, session):
    event = alice_api.post(
        events_url(session), {"type": "USER_MESSAGE", "content": "k", "pinned": True}, format="json"
    ).json()
    assert event["pinned"] is True


@pytest.mark.parametrize("body", [{"pinned": "yes"}, {}, {"pinned": None}])
def test_it_refuses_a_bad_pin_request(alice_api, session, body):
    event = Event.objects.get(session_id=session["id"], seq=1)
    response = alice_api.patch(f"{events_url(session)}/{event.id}", body, format="json")
    assert response.status_code == 400
    assert "pinned" in response.json()["fields"]
    assert Event.objects.get(pk=event.id).pinned is False


def test_it_returns_404_for_an_unknown_event(alice_api, session):
    assert alice_api.get(f"{events_url(session)}/{uuid.uuid4()}").status_code == 404
    assert alice_api.get(f"{events_url(session)}/nope").json()["error"] == "not_found"


def test_it_does_not_show_an_event_under_another_session(alice_api, session):
    other = alice_api.post(SESSIONS, {"model": "gpt-4o"}, format="json").json()
    event = Event.objects.get(session_id=session["id"], seq=1)
    assert alice_api.get(f"{events_url(other)}/{event.id}").status_code == 404


def _fill(api, session, n):
    body = [
        {"type": "USER_MESSAGE" if i % 2 else "AGENT_MESSAGE", "content": f"message {i}"}
        for i in range(n)
    ]
    response = api.post(events_url(session), body, format="json")
    assert response.status_code == 201


def test_it_paginates_events_with_a_cursor(alice_api, session):
    _fill(alice_api, session, 11)  # seq 2..12
    seqs: list[int] = []
    after = 0
    pages = 0
    while True:
        page = alice_api.get(events_url(session), {"after": after, "limit": 5}).json()
        seqs += [e["seq"] for e in page["results"]]
        pages += 1
        if page["nextAfter"] is None:
            break
        assert page["nextAfter"] == page["results"][-1]["seq"]
        after = page["nextAfter"]
    assert seqs == list(range(1, 13))
    assert pages == 3
    page = alice_api.get(events_url(session), {"after": 10}).json()
    assert [e["seq"] for e in page["results"]] == [11, 12]
    assert page["nextAfter"] is None


def test_it_gives_no_cursor_when_the_page_is_exactly_full(alice_api, session):
    _fill(alice_api, session, 3)  # seq 1..4
    page = alice_api.get(events_url(session), {"limit": 4}).json()
    assert len(page["results"]) == 4
    assert page["nextAfter"] is None


@pytest.mark.parametrize(
    "params",
    [
        {"after": "x"},
        {"after": -1},
        {"limit": 0},
        {"limit": 1001},
        {"limit": "1.5"},
        {"includeCompacted": "maybe"},
    ],
)
def test_it_refuses_bad_paging_parameters(alice_api, session, params):
    response = alice_api.get(events_url(session), params)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_parameter"
    assert next(iter(params)) in response.json()["fields"]


def test_it_hides_compacted_events_unless_asked(alice_api, session):
    _fill(alice_api, session, 4)  # seq 2..5
    stored = Session.objects.get(pk=session["id"])
    # A compaction as compaction_app records it: a COMPACTION event folding earlier events.
    marker = Event.objects.create(
        session=stored, seq=6, type=EventType.COMPACTION, content="summary of 2-3", token_count=10
    )
    Event.objects.filter(session=stored, seq__in=[2, 3]).update(compacted_by=marker)
    Session.objects.filter(pk=stored.pk).update(last_seq=6)

    default = alice_api.get(events_url(session)).json()["results"]
    assert [e["seq"] for e in default] == [1, 4, 5, 6]
    everything = alice_api.get(events_url(session), {"includeCompacted": "true"}).json()["results"]
    assert [e["seq"] for e in everything] == [1, 2, 3, 4, 5, 6]
    assert everything[1]["compactedBy"] == str(marker.id)
    paged = alice_api.get(
        events_url(session), {"includeCompacted": "true", "after": 1, "limit": 2}
    ).json()
    assert [e["seq"] for e in paged["results"]] == [2, 3]
    assert paged["nextAfter"] == 3


def test_it_continues_seq_after_earlier_appends(alice_api, session):
    for i in range(3):
        alice_api.post(
            events_url(session), {"type": "USER_MESSAGE", "content": str(i)}, format="json"
        )
    response = alice_api.post(
        events_url(session), [{"type": "USER_MESSAGE", "content": "x"}] * 2, format="json"
    )
    assert [e["seq"] for e in response.json()] == [5, 6]


def test_it_refuses_too_many_events_in_one_request(alice_api, session, settings):
    settings.API_MAX_EVENTS_PER_REQUEST = 3
    before = snapshot(alice_api, session)
    response = alice_api.post(
        events_url(session), [{"type": "USER_MESSAGE", "content": "x"}] * 4, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"] == "too_many_events"
    assert snapshot(alice_api, session) == before


def test_it_refuses_an_empty_list(alice_api, session):
    response = alice_api.post(events_url(session), [], format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "empty_request"


@pytest.mark.parametrize("stored", ['{"w":Infinity}', '[1e400,"x"]', '{"w":NaN,"v":-Infinity}'])
def test_it_renders_every_read_of_content_stored_with_a_non_finite_number(alice_api, stored):
    """Content stored before the door refused such numbers (or written by SQL) still renders:
    every read shows the number as its text instead of failing the whole session."""
    sid = alice_api.post(
        "/api/v1/sessions", {"model": "gpt-4o", "systemPrompt": "sys"}, format="json"
    ).json()["id"]
    made = alice_api.post(
        f"/api/v1/sessions/{sid}/events",
        [
            {"type": "USER_MESSAGE", "content": [{"type": "text", "text": "q"}]},
            {"type": "TOOL_CALL", "content": stored, "name": "calc", "toolCallId": "c1"},
        ],
        format="json",
    )
    assert made.status_code == 201
    first = made.json()[0]["id"]
    Event.objects.filter(pk=first).update(content=stored, content_is_json=True)
    base = f"/api/v1/sessions/{sid}"
    for method, path in [
        ("get", "/events"),
        ("get", f"/events/{first}"),
        ("get", "/context"),
        ("get", "/context?format=anthropic"),
        ("post", "/context"),
        ("post", "/recall"),
    ]:
        body = {"query": "q"} if path == "/recall" else {}
        response = getattr(alice_api, method)(base + path, body, format="json")
        assert response.status_code == 200, (path, response.content)
    events = alice_api.get(f"{base}/events").json()
    content = next(e for e in events["results"] if e["id"] == first)["content"]
    assert json.dumps(content, allow_nan=False)
