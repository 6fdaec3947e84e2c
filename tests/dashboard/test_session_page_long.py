"""The session page at any length (issue 25): names for untitled sessions, "nothing to fold",
folded stretches as one row, one summary count, a bounded first paint with "earlier" on demand,
a chart from per-run aggregates, and the get-started panel."""

from __future__ import annotations

import re

import pytest
from rest_framework.authtoken.models import Token

from compaction_app.dashboard import queries
from compaction_app.models import CompactionRun, RunningSummary
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.models import Event, Session
from sessions_app.services import EventInput, event_append, session_create
from tests.dashboard.test_dashboard_views import client_for, page
from tests.support.long_session import summarized_session

pytestmark = pytest.mark.django_db


def test_it_names_an_untitled_session_by_its_client_key_or_first_user_message(alice):
    keyed = session_create(owner=alice, model="gpt-4o")
    Session.objects.filter(pk=keyed.pk).update(client_key="agent-thread-42")
    plain = session_create(owner=alice, model="gpt-4o")
    event_append(
        session=plain,
        events=[EventInput(type="USER_MESSAGE", content="\nRefactor the billing module\nplease")],
    )
    client = client_for(alice)
    listing = client.get("/").content.decode()
    assert "agent-thread-42" in listing and "Refactor the billing module" in listing
    assert "(untitled)" not in listing
    assert "<h1>Refactor the billing module</h1>" in client.get(page(plain)).content.decode()


def test_it_says_nothing_to_fold_for_a_compaction_that_folded_nothing(alice):
    session = session_create(owner=alice, model="gpt-4o")
    event_append(session=session, events=[EventInput(type="USER_MESSAGE", content="hi")])
    run = compaction_request(session=session, user=None, strategy="summarize", enqueue=False)
    run = compaction_execute(run_id=run.pk)
    assert run.status == "completed" and run.folded_count == 0
    client = client_for(alice)
    for html in (client.get(page(session)).content.decode(), client.get("/").content.decode()):
        assert "nothing to fold" in html
        assert "−0.0 %" not in html and "0 of 0 items" not in html


@pytest.fixture
def long_session(alice):
    return summarized_session(alice, turns=60, title="Sixty turns")


def test_it_collapses_consecutive_folded_runs_into_one_row(alice, long_session):
    html = client_for(alice).get(page(long_session)).content.decode()
    timeline = html[html.index('id="timeline"') :]
    assert timeline.count('class="fold-group fold-run"') == 1
    # Inside the one row, each compaction's group is still there to expand.
    runs = CompactionRun.objects.filter(session=long_session, status="completed").count()
    assert runs >= 55
    assert re.search(r"folded into the summary by \d+ compactions", timeline)


def test_it_shows_the_summarys_token_count_the_same_everywhere(alice, long_session):
    html = client_for(alice).get(page(long_session)).content.decode()
    run = (
        CompactionRun.objects.filter(session=long_session, status="completed")
        .order_by("-created_at")
        .first()
    )
    # The card shows what the summary costs in the context: its COMPACTION event's count (the
    # text plus the message framing), as the timeline's summary entry and GET /summary's
    # messageTokenCount give it (docs/dashboard.md; issue 39 made the card and entry agree).
    count = run.compaction_event.token_count
    card = re.search(r'<span class="summary-tokens">([\d,]+)</span>', html).group(1)
    assert card == f"{count:,}"
    token = Token.objects.get_or_create(user=alice)[0].key
    summary = (
        client_for(alice)
        .get(f"/api/v1/sessions/{long_session.pk}/summary", HTTP_AUTHORIZATION=f"Token {token}")
        .json()
    )
    assert summary["messageTokenCount"] == count
    # The summary's own size (what maxSummaryTokens bounds) is the run's and tokenCount.
    own = RunningSummary.objects.get(session=long_session).token_count
    assert own == run.summary_tokens == summary["tokenCount"] < count


def test_it_renders_the_latest_window_and_loads_earlier_events_on_demand(alice, long_session):
    client = client_for(alice)
    html = client.get(page(long_session)).content.decode()
    assert len(html.encode()) <= 150 * 1024
    first = re.search(r'id="earlier-(\d+)".*?hx-get="([^"]+)"', html, re.S)
    assert first is not None
    before = int(first.group(1))
    assert f'id="event-{before - 1}"' not in html
    chunk = client.get(first.group(2), HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in chunk and 'id="timeline"' not in chunk
    assert f'id="event-{before - 1}"' in chunk or 'id="fold-' in chunk
    seqs = [int(s) for s in re.findall(r'id="event-(\d+)"', chunk)]
    assert seqs and max(seqs) < before
    # Walk back to the start: every window ends, the first one has no "earlier" link.
    url, seen = first.group(2), 0
    while url and seen < 20:
        chunk = client.get(url, HTTP_HX_REQUEST="true").content.decode()
        nxt = re.search(r'class="earlier"[^>]*>.*?hx-get="([^"]+)"', chunk, re.S)
        url, seen = (nxt.group(1) if nxt else None), seen + 1
    assert url is None and 'id="event-1"' in chunk


def test_it_draws_the_chart_from_run_aggregates_ending_at_todays_context(long_session):
    series = queries.chart_series(session=long_session)
    runs = CompactionRun.objects.filter(session=long_session, status="completed").count()
    assert len(series.marks) == runs
    assert series.points[-1].tokens == long_session.context_tokens
    assert len(series.points) <= 300


def test_it_draws_a_short_session_without_runs_event_by_event(alice):
    session = session_create(owner=alice, model="gpt-4o", system_prompt="sys")
    event_append(
        session=session,
        events=[EventInput(type="USER_MESSAGE", content=f"message {n}") for n in range(5)],
    )
    session.refresh_from_db()
    series = queries.chart_series(session=session)
    assert [p.seq for p in series.points] == list(range(1, 7))
    assert series.points[-1].tokens == session.context_tokens
    assert Event.objects.filter(session=session).count() == 6


def test_it_shows_a_new_user_how_to_start_and_keeps_the_panel_reachable(alice, bob):
    token = Token.objects.create(user=alice).key
    Token.objects.create(user=bob)
    client = client_for(alice)
    html = client.get("/").content.decode()
    assert 'id="get-started"' in html
    # Shown as it is, not behind a "show" that the curl line below would give away anyway.
    assert f'<code id="api-token">{token}</code>' in html and "<summary>show</summary>" not in html
    assert "http://testserver/gateway/openai/v1" in html
    assert "ANTHROPIC_BASE_URL=http://testserver/gateway/anthropic" in html
    assert "curl -s -X POST http://testserver/api/v1/sessions" in html
    assert 'href="/get-started/"' in html
    # Later, with sessions: the list is a list, and the link still leads to the panel.
    session_create(owner=alice, model="gpt-4o", title="First")
    assert 'id="get-started"' not in client.get("/").content.decode()
    later = client.get("/get-started/").content.decode()
    assert 'id="get-started"' in later and token in later
    # Every page has its icon.
    assert 'rel="icon"' in later
    # Nobody sees another user's token.
    assert token not in client_for(bob).get("/get-started/").content.decode()


def test_it_reaches_every_run_from_the_page(alice):
    session = session_create(owner=alice, model="gpt-4o", title="Many runs")
    for index in range(7):
        CompactionRun.objects.create(
            session=session,
            strategy="trim",
            status="completed",
            tokens_before=1000 + index,
            tokens_after=500,
            folded_count=1,
        )
    client = client_for(alice)
    html = client.get(page(session)).content.decode()
    history = html[html.index('id="history"') :]
    assert history.count('<tr id="run-') == 5
    assert 'id="history-all"' in history and "show all 7" in history
    everything = client.get(page(session), {"all": "1"}).content.decode()
    history = everything[everything.index('id="history"') :]
    assert history.count('<tr id="run-') == 7 and 'id="history-all"' not in history
    # "show all" by htmx: the history alone, every run, and not the conversation.
    part = client.get(
        page(session), {"all": "1"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="history"
    ).content.decode()
    assert part.lstrip().startswith('<section id="history"')
    assert part.count('<tr id="run-') == 7 and 'id="timeline"' not in part
