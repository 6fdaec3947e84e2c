"""The session page's readable parts through Django's test client: a run's before / after,
citations as links, the thresholds and the staff switch for auto compaction."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from compaction_app.dashboard import queries
from compaction_app.dashboard.render import SESSION_TEMPLATE, render_parts, session_context
from compaction_app.models import CompactionRun
from compaction_app.templatetags.ledger_dashboard import cite_links
from tests.dashboard.test_dashboard_views import XSS, client_for, compacted, make_session, page


def test_it_links_citations_after_escaping_the_text():
    html = cite_links(f"- chose dict lookup [#12] {XSS} [#40-#44]")
    assert '<a class="cite" href="#event-12">[#12]</a>' in html
    assert '<a class="cite" href="#event-40">[#40-#44]</a>' in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'href="?all=1#event-3"' in cite_links("x [#3]", "?all=1")


@pytest.mark.django_db
def test_it_opens_a_runs_before_and_after_as_a_panel_or_a_page(alice):
    session = make_session(alice, limit=1500)
    run = compacted(session)
    client = client_for(alice)
    url = f"{page(session)}compactions/{run.pk}/"
    panel = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-detail").content.decode()
    assert panel.lstrip().startswith('<section id="run-detail"') and "<html" not in panel
    assert f"{run.tokens_before:,}" in panel and f"{run.tokens_after:,}" in panel
    assert "The summary it wrote" in panel and f"{run.folded_count} events folded" in panel
    folded = session.events.filter(compacted_by=run.compaction_event).order_by("seq").first()
    assert f'href="#event-{folded.seq}"' in panel  # what it folded links to the event
    full = client.get(url).content.decode()
    assert "<html" in full and 'id="run-detail"' in full and 'id="timeline"' in full
    closed = client.get(page(session), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-detail")
    assert closed.content.decode().strip() == '<div id="run-detail"></div>'


@pytest.mark.django_db
def test_it_hides_another_users_run(alice, bob):
    session = make_session(alice, limit=1500)
    run = compacted(session)
    assert client_for(bob).get(f"{page(session)}compactions/{run.pk}/").status_code == 404
    other = make_session(alice, limit=1500)
    assert client_for(alice).get(f"{page(other)}compactions/{run.pk}/").status_code == 404


@pytest.mark.django_db
def test_it_lists_dropped_evidence_by_kind_with_links(alice):
    session = make_session(alice, limit=1500)
    run = compacted(session)
    run.loss_report = {  # type: ignore[attr-defined]
        "evidenceBefore": 4,
        "evidenceKept": 2,
        "keptPercent": 50.0,
        "droppedTotal": 2,
        "dropped": [
            {"kind": "path", "text": "src/m1.py", "seq": 5},
            {"kind": "error", "text": XSS, "seq": 7},
        ],
    }
    detail = queries.run_detail(run=run)
    assert [kind for kind, _ in detail.dropped_by_kind] == ["error", "path"]
    context = session_context(session=session, user=alice, detail=detail)
    html = render_parts(SESSION_TEMPLATE, ["run_detail"], context, oob=False)
    assert "What this compaction dropped" in html and "2 of 4 evidence items kept (50.0 %)" in html
    assert 'href="#event-5"' in html and "<code>src/m1.py</code>" in html
    assert "<script>" not in html


@pytest.mark.django_db
def test_it_shows_the_thresholds_and_the_tokens_until_the_next_compaction(alice):
    session = make_session(alice, limit=4000, settings={"autoCompact": True})
    html = client_for(alice).get(page(session)).content.decode()
    schedule = queries.schedule_for(session=session)
    assert schedule.compact_at == 3200 and schedule.hard_at == 3800
    assert schedule.tokens_to_compact == 3200 - session.context_tokens
    assert "compact at 80 %" in html and "hard limit 95 %" in html
    assert f'id="tokens-to-compact">{schedule.tokens_to_compact:,}<' in html
    assert html.count('class="gauge-tick') == 2 and html.count('class="threshold-line') >= 2
    assert schedule.tokens_to_refresh == 800_000 - session.cumulative_tokens


@pytest.mark.django_db
def test_it_counts_down_the_cooldown_after_an_auto_run(alice):
    session = make_session(alice, limit=4000, settings={"autoCompact": True, "cooldownSeconds": 60})
    run = CompactionRun.objects.create(session=session, strategy="trim", trigger="auto")
    CompactionRun.objects.filter(pk=run.pk).update(
        status="completed", created_at=timezone.now() - timedelta(seconds=20)
    )
    assert 38 <= queries.schedule_for(session=session).cooldown_left <= 40
    html = client_for(alice).get(page(session)).content.decode()
    assert re.search(r"cooldown (38|39|40) s left", html)


@pytest.mark.django_db
def test_it_lets_staff_switch_auto_compaction_and_refuses_others(alice, staff):
    session = make_session(alice, settings={"autoCompact": True})
    url = f"{page(session)}auto-compact/"
    assert client_for(alice).post(url, {"enabled": "0"}).status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(staff)
    assert strict.post(url, {"enabled": "0"}).status_code == 403  # no CSRF token
    response = client_for(staff).post(url, {"enabled": "0"}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and "Auto compaction is off" in body
    assert 'id="gauge"' in body and 'hx-swap-oob="true"' in body
    session.refresh_from_db()
    assert session.settings["autoCompact"] is False
    client_for(staff).post(url, {"enabled": "1"})
    session.refresh_from_db()
    assert session.settings["autoCompact"] is True


@pytest.mark.django_db
def test_it_shows_a_reverted_run_with_a_neutral_badge_only(alice, staff):
    session = make_session(alice, limit=1500)
    run = compacted(session)
    client_for(staff).post(f"{page(session)}compactions/{run.pk}/revert/")
    html = client_for(staff).get(page(session)).content.decode()
    row = html[html.index(f'id="run-{run.pk}"') :]
    row = row[: row.index("</tr>")]
    assert 'class="badge reverted"' in row and 'class="badge completed"' not in row
    with open("static/css/dashboard.css") as css:
        assert ".badge.reverted, .badge.neutral { background: #eceff3" in css.read()


@pytest.mark.django_db
def test_it_switches_the_chart_to_a_time_axis(alice):
    session = make_session(alice)
    chart = client_for(alice).get(
        f"{page(session)}?axis=time", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="chart"
    )
    body = chart.content.decode()
    assert body.lstrip().startswith('<section id="chart"') and "by time" in body
    assert "Context tokens by time" in body
