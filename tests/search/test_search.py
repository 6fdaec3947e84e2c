"""Full-text search over events (FTS5 on SQLite, tsvector + GIN on PostgreSQL), through the API
and the dashboard. Run under both profiles: plain `pytest`, and with DATABASE_URL set."""

from __future__ import annotations

import time
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test import Client

from compaction_app.models import RunStatus
from compaction_app.services import compaction_execute, compaction_request
from sessions_app import search_index, search_schema
from sessions_app.models import Event, Session
from sessions_app.receivers import repair_search_schema
from tests.support.helpers import append_events, create_session

SESSIONS = "/api/v1/sessions"

IDENTIFIER_EVENTS = [
    {"type": "USER_MESSAGE", "content": "The deploy failed: upstream said ERR_RATE_LIMITED."},
    {
        "type": "TOOL_CALL",
        "name": "bash",
        "toolCallId": "call_git",
        "content": '{"cmd": "git log --oneline -3"}',
    },
    {
        "type": "TOOL_RESULT",
        "name": "bash",
        "toolCallId": "call_git",
        "content": "4be1f07 Archive old orders\n9c0d2e1 Bump httpx to 0.28.1\n",
    },
    {
        "type": "AGENT_MESSAGE",
        "content": "Migration 0042_orders_archive_2025 moves rows into orders_archive_2025; "
        "see src/billing/models.py and https://api.example.com:8443/v1/orders.",
    },
    {"type": "USER_MESSAGE", "content": "Set FEATURE_FLAG_NEW_BILLING=true, 日本語 works too."},
]


def search_api(api, session_id, q, **params):
    return api.get(f"{SESSIONS}/{session_id}/search", {"q": q, **params})


def hits(api, session_id, q, **params) -> list[dict]:
    response = search_api(api, session_id, q, **params)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def seqs(results) -> list[int]:
    return [hit["seq"] for hit in results]


def session_with(api, events) -> str:
    session_id = create_session(api, limit=100_000)
    append_events(api, session_id=session_id, events=events)
    return session_id


def compact(session_id) -> None:
    session = Session.objects.get(pk=session_id)
    run = compaction_request(session=session, user=None, strategy="trim", enqueue=False)
    run = compaction_execute(run_id=run.pk)
    assert run.status == RunStatus.COMPLETED, run.error


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("q", "expected_seq"),
    [
        ("ERR_RATE_LIMITED", 2),
        ("err_rate_limited", 2),
        ("RATE_LIMITED", 2),
        ("4be1f07", 4),
        ("4be1f", 4),  # a short hash finds the long one (prefix)
        ("0.28.1", 4),
        ("orders_archive_2025", 5),
        ("0042_orders_archive_2025", 5),
        ("src/billing/models.py", 5),
        ("models.py", 5),
        ("api.example.com:8443", 5),
        ("FEATURE_FLAG_NEW_BILLING=true", 6),
        ("日本語", 6),
        ("git log", 3),
    ],
)
def test_it_finds_identifiers_hashes_paths_and_urls(alice_api, q, expected_seq):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    assert seqs(hits(alice_api, session_id, q)) == [expected_seq]


@pytest.mark.django_db
def test_it_returns_ranked_hits_with_event_fields_and_limit(alice_api):
    events = [
        {"type": "USER_MESSAGE", "content": "timeout once"},
        {"type": "AGENT_MESSAGE", "content": "timeout timeout timeout in worker: timeout"},
        {"type": "AGENT_MESSAGE", "content": "nothing relevant here"},
        {"type": "LOCAL_SYSTEM_MESSAGE", "content": "people-only note: timeout"},
    ]
    session_id = session_with(alice_api, events)
    results = hits(alice_api, session_id, "timeout")
    assert set(seqs(results)) == {2, 3, 5}
    assert results[0]["seq"] == 3  # most occurrences ranks first
    stored = {e.seq: e for e in Event.objects.filter(session_id=session_id)}
    assert results[0] == {
        "seq": 3,
        "eventId": str(stored[3].pk),
        "type": "AGENT_MESSAGE",
        "name": "",
        "folded": False,
        "snippet": "timeout timeout timeout in worker: timeout",
        "matches": [
            {"start": 0, "end": 7},
            {"start": 8, "end": 15},
            {"start": 16, "end": 23},
            {"start": 35, "end": 42},
        ],
    }
    assert len(hits(alice_api, session_id, "timeout", limit=1)) == 1
    assert hits(alice_api, session_id, "absent") == []


@pytest.mark.django_db
def test_it_searches_folded_events_and_marks_them(alice_api):
    events = [{"type": "USER_MESSAGE", "content": "Old fact: shard key is tenant_uuid_77."}]
    events += [{"type": "AGENT_MESSAGE", "content": f"step {n} " * 200} for n in range(12)]
    events += [{"type": "USER_MESSAGE", "content": "Latest ask mentions tenant_uuid_77 again."}]
    session_id = create_session(alice_api, limit=3000)
    append_events(alice_api, session_id=session_id, events=events)
    compact(session_id)
    folded = Event.objects.get(session_id=session_id, seq=2)
    assert folded.compacted_by_id is not None

    results = hits(alice_api, session_id, "tenant_uuid_77")
    by_seq = {hit["seq"]: hit for hit in results}
    assert set(by_seq) == {2, 15}
    assert by_seq[2]["folded"] is True and by_seq[15]["folded"] is False
    # The active events list no longer shows it; search still does.
    listed = alice_api.get(f"{SESSIONS}/{session_id}/events?limit=1000").json()["results"]
    assert 2 not in [event["seq"] for event in listed]


@pytest.mark.django_db
def test_it_gives_plain_snippets_with_match_offsets_and_leaves_html_to_the_page(alice, alice_api):
    from django.test import Client

    text = "<script>alert('x')</script> & the failing_test_name in " + "padding " * 80
    session_id = session_with(
        alice_api, [{"type": "TOOL_RESULT", "toolCallId": "t", "content": text}]
    )
    (hit,) = hits(alice_api, session_id, "failing_test_name")
    snippet = hit["snippet"]
    # The API's text is the event's, unescaped: a client escapes it where it renders HTML.
    assert snippet.startswith("<script>alert('x')</script> & the failing_test_name in ")
    assert "<mark>" not in snippet and "&lt;" not in snippet
    ((start, end),) = [(m["start"], m["end"]) for m in hit["matches"]]
    assert snippet[start:end] == "failing_test_name"
    assert snippet.endswith("…")
    assert len(snippet) < 400
    # The page escapes it and marks the match.
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/sessions/{session_id}/search/", {"q": "failing_test_name"})
    html = page.content.decode()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; the " in html
    assert "<mark>failing_test_name</mark>" in html
    assert "<script>alert('x')" not in html

    late = "lorem ipsum " * 100 + "the needle_42 is here " + "dolor " * 100
    session_id = session_with(alice_api, [{"type": "USER_MESSAGE", "content": late}])
    (hit,) = hits(alice_api, session_id, "needle_42")
    snippet = hit["snippet"]
    assert snippet.startswith("…") and snippet.endswith("…")
    assert "the needle_42 is here" in snippet
    assert [snippet[m["start"] : m["end"]] for m in hit["matches"]] == ["needle_42"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "q",
    [
        '"',
        '"unterminated',
        "NEAR(ERR RATE)",
        "NEAR",
        "*",
        "ERR*",
        "-ERR",
        "ERR AND OR NOT",
        "((( )))",
        "{sid}:x",
        "body:ERR",
        "^ERR",
        "ERR + RATE",
        "'; DROP TABLE sessions_app_event; --",
        "a\x00b",
        "%ED%A0%80",  # a lone surrogate's UTF-8 bytes, sent raw
        "🚀🚀",
        "e" * 400,
        "!:&|<->",
    ],
)
def test_it_never_fails_on_search_syntax(alice_api, q):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    query = q if q.startswith("%") else urlencode({"q": q})[2:]
    response = alice_api.get(f"{SESSIONS}/{session_id}/search?q={query}")
    assert response.status_code == 200, response.content
    assert isinstance(response.json()["results"], list)
    cross = alice_api.get(f"/api/v1/search?q={query}")
    assert cross.status_code == 200, cross.content
    assert Event.objects.filter(session_id=session_id).count() == len(IDENTIFIER_EVENTS) + 1


@pytest.mark.django_db
def test_it_treats_operator_words_as_plain_text(alice_api):
    events = [
        {"type": "USER_MESSAGE", "content": "the NEAR constant and the AND gate"},
        {"type": "USER_MESSAGE", "content": "the gate"},
    ]
    session_id = session_with(alice_api, events)
    assert seqs(hits(alice_api, session_id, "NEAR")) == [2]
    assert seqs(hits(alice_api, session_id, '"AND" gate')) == [2]
    assert set(seqs(hits(alice_api, session_id, "-gate"))) == {2, 3}  # not a negation


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "q"),
        ({"q": ""}, "q"),
        ({"q": "   "}, "q"),
        ({"q": "x" * 501}, "q"),
        ({"q": "x", "limit": "0"}, "limit"),
        ({"q": "x", "limit": "101"}, "limit"),
        ({"q": "x", "limit": "ten"}, "limit"),
    ],
)
def test_it_rejects_a_missing_or_oversized_query_and_bad_limits(alice_api, params, field):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    for url in (f"{SESSIONS}/{session_id}/search", "/api/v1/search"):
        response = alice_api.get(url, params)
        assert response.status_code == 400, response.content
        body = response.json()
        assert body["error"] in ("invalid_query", "invalid_parameter")
        assert field in body["fields"]


@pytest.mark.django_db
def test_it_keeps_each_users_events_to_themselves(alice_api, bob_api, staff_api, alice):
    alice_session = session_with(alice_api, IDENTIFIER_EVENTS)
    bob_session = session_with(
        bob_api, [{"type": "USER_MESSAGE", "content": "bob ERR_RATE_LIMITED"}]
    )

    assert search_api(bob_api, alice_session, "ERR_RATE_LIMITED").status_code == 404
    assert seqs(hits(bob_api, bob_session, "ERR_RATE_LIMITED")) == [2]

    bob_cross = bob_api.get("/api/v1/search", {"q": "ERR_RATE_LIMITED"}).json()["results"]
    assert [hit["sessionId"] for hit in bob_cross] == [bob_session]
    alice_cross = alice_api.get("/api/v1/search", {"q": "ERR_RATE_LIMITED"}).json()["results"]
    assert [hit["sessionId"] for hit in alice_cross] == [alice_session]
    assert alice_cross[0]["sessionTitle"] == Session.objects.get(pk=alice_session).title
    assert alice_api.get("/api/v1/search", {"q": "bob"}).json()["results"] == []

    staff_cross = staff_api.get("/api/v1/search", {"q": "ERR_RATE_LIMITED"}).json()["results"]
    assert {hit["sessionId"] for hit in staff_cross} == {alice_session, bob_session}
    assert search_api(staff_api, alice_session, "4be1f07").status_code == 200


@pytest.mark.django_db
def test_it_forgets_the_events_of_a_deleted_session(alice_api):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    assert len(alice_api.get("/api/v1/search", {"q": "4be1f07"}).json()["results"]) == 1
    assert alice_api.delete(f"{SESSIONS}/{session_id}").status_code == 204
    assert alice_api.get("/api/v1/search", {"q": "4be1f07"}).json()["results"] == []
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {search_schema.MAP_TABLE}")
            assert cursor.fetchone()[0] == 0
            cursor.execute(f"SELECT count(*) FROM {search_schema.FTS_TABLE}")
            assert cursor.fetchone()[0] == 0
            cursor.execute(f"SELECT count(*) FROM {search_schema.STATE_TABLE}")
            assert cursor.fetchone()[0] == 0


@pytest.mark.django_db
@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite index")
def test_it_indexes_sqlite_events_once_and_restores_dropped_triggers(alice_api):
    from django.apps import apps

    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    assert search_index.search_index_pending(session_id=session_id) == len(IDENTIFIER_EVENTS) + 1
    assert search_index.search_index_pending(session_id=session_id) == 0
    append_events(
        alice_api, session_id=session_id, events=[{"type": "USER_MESSAGE", "content": "zq9"}]
    )
    # Not indexed yet (no worker here): the search indexes it first.
    assert seqs(hits(alice_api, session_id, "zq9")) == [7]
    assert search_index.search_index_pending(session_id=session_id) == 0

    def triggers() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
            return {row[0] for row in cursor.fetchall()}

    before = triggers()
    assert f"{search_schema.FTS_TABLE}_delete" in before
    with connection.cursor() as cursor:
        # What a later migration's rebuild of the event table does to them.
        cursor.execute(f"DROP TRIGGER {search_schema.FTS_TABLE}_delete")
    repair_search_schema(None, app_config=apps.get_app_config("sessions_app"), using="default")
    assert triggers() == before


@pytest.mark.django_db
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's background index")
def test_it_finds_events_before_and_after_postgres_writes_their_vectors(alice_api):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM sessions_app_event WHERE session_id = %s "
            f"AND {search_schema.VECTOR_COLUMN} IS NULL",
            [session_id],
        )
        assert cursor.fetchone()[0] == len(IDENTIFIER_EVENTS) + 1  # not indexed yet
    # A cross-session search computes the missing vectors in the query...
    cross = alice_api.get("/api/v1/search", {"q": "orders_archive_2025"}).json()["results"]
    assert [hit["seq"] for hit in cross] == [5]
    assert _unindexed(session_id) == len(IDENTIFIER_EVENTS) + 1
    # ...and a session search first writes them.
    assert seqs(hits(alice_api, session_id, "orders_archive_2025")) == [5]
    assert _unindexed(session_id) == 0
    append_events(alice_api, session_id=session_id, events=IDENTIFIER_EVENTS[:1])
    assert search_index.search_index_pending(session_id=session_id) == 1
    assert search_index.search_index_pending(session_id=session_id) == 0
    assert seqs(hits(alice_api, session_id, "orders_archive_2025")) == [5]
    assert seqs(hits(alice_api, session_id, "models.py")) == [5]


def _unindexed(session_id) -> int:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT count(*) FROM sessions_app_event WHERE session_id = %s "
                f"AND {search_schema.VECTOR_COLUMN} IS NULL",
                [session_id],
            )
        else:
            cursor.execute(
                f"SELECT s.last_seq - coalesce(st.indexed_seq, 0) FROM sessions_app_session s "
                f"LEFT JOIN {search_schema.STATE_TABLE} st ON st.session_id = s.id WHERE s.id = %s",
                [Session.objects.get(pk=session_id).pk.hex],
            )
        return cursor.fetchone()[0]


def test_it_indexes_appended_events_in_a_celery_task(worker, alice_api):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    deadline = time.monotonic() + 20
    while (pending := _unindexed(session_id)) != 0:
        assert time.monotonic() < deadline, f"{pending} events still unindexed"
        time.sleep(0.05)
    assert search_index.search_index_pending(session_id=session_id) == 0
    assert seqs(hits(alice_api, session_id, "ERR_RATE_LIMITED")) == [2]


# --- dashboard --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_offers_search_as_you_type_on_the_session_page(alice, alice_api, bob):
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    client = Client()
    client.force_login(alice)
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert 'id="event-search"' in page
    assert 'hx-trigger="keyup changed delay:300ms' in page
    assert f'hx-get="/sessions/{session_id}/search/"' in page

    partial = client.get(
        f"/sessions/{session_id}/search/", {"q": "4be1f07"}, headers={"HX-Request": "true"}
    )
    html = partial.content.decode()
    assert partial.status_code == 200
    assert "<html" not in html
    assert '?all=1#event-4"' in html and 'data-seq="4"' in html
    assert "<mark>4be1f07</mark>" in html

    # Without JavaScript the form's GET answers the whole page, results included.
    full = client.get(f"/sessions/{session_id}/search/", {"q": "4be1f07"}).content.decode()
    assert "<html" in full and "<mark>4be1f07</mark>" in full and 'id="timeline"' in full

    empty = client.get(f"/sessions/{session_id}/search/", {"q": '"'}).content.decode()
    assert "No events match" in empty or empty.strip() == ""

    stranger = Client()
    stranger.force_login(bob)
    assert stranger.get(f"/sessions/{session_id}/search/", {"q": "4be1f07"}).status_code == 404


@pytest.mark.django_db
def test_it_matches_event_content_in_the_sessions_list_search(alice, alice_api, bob_api):
    found = session_with(alice_api, IDENTIFIER_EVENTS)
    other = session_with(alice_api, [{"type": "USER_MESSAGE", "content": "unrelated"}])
    session_with(bob_api, IDENTIFIER_EVENTS)  # bob's: never listed for alice
    client = Client()
    client.force_login(alice)
    html = client.get("/", {"q": "orders_archive_2025"}).content.decode()
    assert f"row-{found}" in html and f"row-{other}" not in html
    assert html.count('id="row-') == 1


@pytest.mark.django_db(transaction=True)
def test_it_appends_and_searches_while_the_broker_is_down(alice_api, monkeypatch):
    from kombu.exceptions import OperationalError

    from sessions_app import receivers
    from sessions_app.tasks import search_index_everything_task

    attempts = []

    def refuse(*args, **kwargs):  # the broker's side of the wire: connection refused
        attempts.append(args)
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(search_index_everything_task, "apply_async", refuse)
    monkeypatch.setattr(receivers, "_broker_failed_at", {})
    session_id = session_with(alice_api, IDENTIFIER_EVENTS)
    append_events(alice_api, session_id=session_id, events=IDENTIFIER_EVENTS[:1])
    assert len(attempts) == 1  # the first append (the system prompt) tried; later ones back off
    assert seqs(hits(alice_api, session_id, "4be1f07")) == [4]


@pytest.mark.skipif(
    not __import__("pathlib").Path("/usr/bin/chromium").exists(), reason="no /usr/bin/chromium"
)
def test_it_jumps_from_a_search_hit_to_its_folded_event_in_a_browser(
    live_server, alice, monkeypatch
):
    from playwright.sync_api import sync_playwright

    from compaction_app.testkit.browser import launch_chromium

    # Playwright's sync API keeps an asyncio loop on this thread; the ORM calls below are
    # plain synchronous test code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from sessions_app.services import EventInput, event_append, session_create

    session = session_create(
        owner=alice, model="gpt-4o", context_limit=3000, settings={"autoCompact": False}
    )
    event_append(
        session=session,
        events=[EventInput(type="USER_MESSAGE", content="Remember needle_7731 for later.")]
        + [EventInput(type="AGENT_MESSAGE", content=f"step {n} " * 150) for n in range(10)]
        + [EventInput(type="USER_MESSAGE", content="Now write the fix.")],
    )
    compact(session.pk)
    assert Event.objects.get(session=session, seq=1).compacted_by_id is not None

    client = Client()
    client.force_login(alice)
    cookie = client.cookies["sessionid"].value
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            context = browser.new_context()
            context.set_default_timeout(20_000)
            context.add_cookies([{"name": "sessionid", "value": cookie, "url": live_server.url}])
            page = context.new_page()
            page.goto(f"{live_server.url}/sessions/{session.pk}/")
            folded = page.locator("#event-1")
            assert not folded.is_visible()  # inside a closed fold
            page.locator("#event-search").press_sequentially("needle_77", delay=20)
            hit = page.locator("a.search-hit[data-seq='1']")
            hit.wait_for()
            assert page.locator("#search-results mark").first.inner_text() == "needle_7731"
            hit.click()
            folded.wait_for(state="visible")
            assert page.evaluate("location.hash") == "#event-1"
            assert page.evaluate("document.getElementById('event-1').closest('details').open")
        finally:
            browser.close()
