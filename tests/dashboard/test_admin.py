"""The Django admin for sessions and events, driven through the test client as a superuser."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from sessions_app import services
from sessions_app.models import Event, EventType, Session
from sessions_app.services import EventInput


@pytest.fixture
def admin_client_(db):
    user = get_user_model().objects.create_superuser(username="root", password="pw-root")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def ledger(alice, bob):
    first = services.session_create(
        owner=alice, model="gpt-4o", title="Refactor parser", system_prompt="sys"
    )
    services.event_append(
        session=first,
        events=[
            EventInput(type=EventType.USER_MESSAGE, content="please refactor the <b>parser</b>"),
            EventInput(
                type=EventType.TOOL_CALL,
                content='{"f": "p.py"}',
                name="read_file",
                tool_call_id="call_9",
            ),
            EventInput(
                type=EventType.TOOL_RESULT, content="def parse(): ...", tool_call_id="call_9"
            ),
        ],
    )
    second = services.session_create(owner=bob, model="claude-3.5-sonnet", title="Write docs")
    services.event_append(
        session=second, events=[EventInput(type=EventType.USER_MESSAGE, content="docs please")]
    )
    return Session.objects.get(pk=first.pk), Session.objects.get(pk=second.pk)


def test_it_lists_sessions_with_usage(admin_client_, ledger):
    first, second = ledger
    response = admin_client_.get("/admin/sessions_app/session/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Refactor parser" in html and "Write docs" in html
    assert "alice" in html and "bob" in html
    assert "gpt-4o" in html and "claude-3.5-sonnet" in html
    assert f"{first.context_tokens:,} / 128,000" in html
    assert f"?session__id__exact={first.pk}" in html


@pytest.mark.parametrize(
    ("term", "found", "missing"),
    [("Refactor", "Refactor parser", "Write docs"), ("bob", "Write docs", "Refactor parser")],
)
def test_it_searches_sessions_by_title_and_owner(admin_client_, ledger, term, found, missing):
    html = admin_client_.get("/admin/sessions_app/session/", {"q": term}).content.decode()
    assert found in html
    assert missing not in html


def test_it_searches_sessions_by_id(admin_client_, ledger):
    first, second = ledger
    html = admin_client_.get("/admin/sessions_app/session/", {"q": str(second.pk)}).content.decode()
    assert "Write docs" in html
    assert "Refactor parser" not in html


def test_it_filters_sessions_by_model(admin_client_, ledger):
    html = admin_client_.get(
        "/admin/sessions_app/session/", {"model": "claude-3.5-sonnet"}
    ).content.decode()
    assert "Write docs" in html
    assert "Refactor parser" not in html


def test_it_edits_a_session_title_through_the_service(admin_client_, ledger):
    first, _ = ledger
    url = f"/admin/sessions_app/session/{first.pk}/change/"
    page = admin_client_.get(url)
    assert page.status_code == 200
    assert 'name="title"' in page.content.decode()
    assert 'name="event_count"' not in page.content.decode()
    response = admin_client_.post(url, {"title": "Renamed", "context_limit": 64000})
    assert response.status_code == 302
    stored = Session.objects.get(pk=first.pk)
    assert stored.title == "Renamed"
    assert stored.context_limit == 64000
    assert stored.event_count == 4


def test_it_offers_no_session_add(admin_client_, ledger):
    assert admin_client_.get("/admin/sessions_app/session/add/").status_code == 403


def test_it_lists_events(admin_client_, ledger):
    response = admin_client_.get("/admin/sessions_app/event/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "TOOL_CALL" in html and "USER_MESSAGE" in html


def test_it_searches_events_by_session_id(admin_client_, ledger):
    first, second = ledger
    response = admin_client_.get("/admin/sessions_app/event/", {"q": str(second.pk)})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    response = admin_client_.get("/admin/sessions_app/event/", {"q": str(first.pk)})
    assert response.context["cl"].result_count == 4
    response = admin_client_.get("/admin/sessions_app/event/", {"q": "call_9"})
    assert response.context["cl"].result_count == 2


def test_it_filters_events_by_type_and_session(admin_client_, ledger):
    first, _ = ledger
    response = admin_client_.get("/admin/sessions_app/event/", {"type__exact": "TOOL_RESULT"})
    assert response.context["cl"].result_count == 1
    response = admin_client_.get(
        "/admin/sessions_app/event/", {"session__id__exact": str(first.pk)}
    )
    assert response.status_code == 200
    assert response.context["cl"].result_count == 4


def test_it_shows_event_content_read_only(admin_client_, ledger):
    first, _ = ledger
    event = Event.objects.get(session=first, seq=2)
    response = admin_client_.get(f"/admin/sessions_app/event/{event.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    # Shown escaped, as text, and with no form field to edit it.
    assert "please refactor the &lt;b&gt;parser&lt;/b&gt;" in html
    assert 'name="content"' not in html
    assert "<textarea" not in html
    assert 'type="submit" value="Save"' not in html
    before = Event.objects.filter(pk=event.pk).values().get()
    response = admin_client_.post(
        f"/admin/sessions_app/event/{event.pk}/change/", {"content": "rewritten"}
    )
    assert response.status_code == 403
    assert Event.objects.filter(pk=event.pk).values().get() == before


def test_it_refuses_event_add_and_delete(admin_client_, ledger):
    first, _ = ledger
    event = Event.objects.get(session=first, seq=1)
    assert admin_client_.get("/admin/sessions_app/event/add/").status_code == 403
    assert (
        admin_client_.post(
            f"/admin/sessions_app/event/{event.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    assert Event.objects.filter(pk=event.pk).exists()


def test_it_redirects_non_staff_to_login(alice, ledger):
    client = Client()
    client.force_login(alice)
    for url in ("/admin/sessions_app/session/", "/admin/sessions_app/event/"):
        response = client.get(url)
        assert response.status_code == 302
        assert "/admin/login/" in response["Location"]
    anonymous = Client().get("/admin/sessions_app/session/")
    assert anonymous.status_code == 302


def test_it_offers_the_compact_now_action(admin_client_, ledger):
    html = admin_client_.get("/admin/sessions_app/session/").content.decode()
    assert 'value="compact_now"' in html


def test_it_lists_runs_with_tokens_before_and_after(admin_client_, ledger):
    from compaction_app.models import CompactionRun

    session, _ = ledger
    CompactionRun.objects.create(
        session=session, strategy="trim", status="completed", tokens_before=11319, tokens_after=3495
    )
    html = admin_client_.get("/admin/compaction_app/compactionrun/").content.decode()
    assert "11,319 → 3,495" in html


def test_it_lists_gateway_calls_read_only(admin_client_, ledger):
    import datetime

    from sessions_app.calls import call_record

    session, _ = ledger
    call_record(
        session_id=session.pk,
        owner_id=session.owner_id,
        started_at=datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC),
        wire="openai",
        status="timeout",
        model_requested="gpt-4o",
    )
    html = admin_client_.get("/admin/sessions_app/call/").content.decode()
    assert "timeout" in html and "gpt-4o" in html
    assert admin_client_.get("/admin/sessions_app/call/add/").status_code == 403
