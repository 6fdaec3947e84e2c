"""The dashboard's calls table: a session's calls and every session's (staff: every user's),
the same filters as the API, the range's latency percentiles, error rate and totals, and each
row's way to its events."""

from __future__ import annotations

import pytest
from django.test import Client

from sessions_app.services import EventInput, TokenUsage, event_append, session_create
from tests.api.test_api_calls import a_call


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def sessions(alice, bob):
    mine = session_create(owner=alice, model="gpt-4o", title="alice-work")
    theirs = session_create(owner=bob, model="gpt-4o", title="bob-work")
    (reply,) = event_append(
        session=mine,
        events=[
            EventInput(
                type="AGENT_MESSAGE",
                content="done",
                token_usage=TokenUsage(prompt_tokens=40, completion_tokens=6),
            )
        ],
    ).events
    a_call(
        mine,
        0,
        ttfb_ms=120,
        total_ms=900,
        prompt_tokens=40,
        completion_tokens=6,
        thread="main",
        reply_event_id=reply.pk,
    )
    a_call(
        mine,
        1,
        "upstream_unavailable",
        http_status=502,
        total_ms=30,
        error_code="upstream_unavailable",
    )
    a_call(theirs, 0, total_ms=5)
    return mine, theirs, reply


def test_it_shows_a_sessions_calls_with_percentiles_error_rate_totals_and_the_reply(
    alice, sessions
):
    mine, _, reply = sessions
    page = client_for(alice).get(f"/sessions/{mine.pk}/calls/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="sum-calls">2<' in html
    assert "1 (50.0 %)" in html  # errors and error rate
    assert "p50 30 ms" in html and "p99 900 ms" in html
    assert "40 prompt" in html and "= 46" in html
    assert "upstream_unavailable" in html
    assert f'href="/sessions/{mine.pk}/?all=1#event-{reply.seq}"' in html
    # The session page links to its calls.
    assert (
        f"/sessions/{mine.pk}/calls/"
        in client_for(alice).get(f"/sessions/{mine.pk}/").content.decode()
    )


def test_it_filters_as_the_api_does(alice, sessions):
    mine, _, _ = sessions
    client = client_for(alice)
    url = f"/sessions/{mine.pk}/calls/"
    assert 'id="sum-calls">1<' in client.get(url, {"status": "errors"}).content.decode()
    assert 'id="sum-calls">1<' in client.get(url, {"since": "2026-03-01T12:00:30"}).content.decode()
    assert 'id="sum-calls">1<' in client.get(url, {"thread": "main"}).content.decode()
    assert 'id="sum-calls">0<' in client.get(url, {"model": "gpt-4.1"}).content.decode()
    bad = client.get(url, {"since": "yesterday"})
    assert bad.status_code == 400 and 'id="calls-error"' in bad.content.decode()
    assert client.get(url, {"status": "bogus"}).status_code == 400


def test_it_shows_users_their_own_calls_and_staff_every_users(alice, bob, staff, sessions):
    mine, theirs, _ = sessions
    alices = client_for(alice).get("/calls/").content.decode()
    assert "alice-work" in alices and "bob-work" not in alices
    everyone = client_for(staff).get("/calls/").content.decode()
    assert "alice-work" in everyone and "bob-work" in everyone
    assert "every user" in everyone and 'id="sum-calls">3<' in everyone
    assert client_for(bob).get(f"/sessions/{mine.pk}/calls/").status_code == 404
    assert Client().get("/calls/").status_code == 302  # the login page first
