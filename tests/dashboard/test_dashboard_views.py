"""The htmx dashboard through Django's test client, and its websocket consumers."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from compaction_app.models import CompactionRun, RunStatus
from compaction_app.realtime import broadcast
from compaction_app.realtime import messages as realtime
from compaction_app.services import compaction_execute, compaction_request
from config.asgi import application
from sessions_app.models import Event, Session
from sessions_app.services import EventInput, event_append, session_create

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def make_session(owner, *, title="work", limit=4000, turns=6, model="gpt-4o", **kwargs) -> Session:
    session = session_create(
        owner=owner,
        model=model,
        title=title,
        context_limit=limit,
        system_prompt="You are a coding agent.",
        settings={"autoCompact": False, **kwargs.pop("settings", {})},
    )
    events = []
    for turn in range(turns):
        events += [
            EventInput(type="USER_MESSAGE", content=f"Please fix bug {turn} in src/m{turn}.py"),
            EventInput(type="AGENT_MESSAGE", content=f"Fixed bug {turn}. " + "detail " * 40),
        ]
    if events:
        event_append(session=session, events=events)
    session.refresh_from_db()
    return session


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(session) -> str:
    return f"/sessions/{session.pk}/"


def compacted(session, *, strategy="summarize") -> CompactionRun:
    run = compaction_request(session=session, user=None, strategy=strategy, enqueue=False)
    run = compaction_execute(run_id=run.pk)
    assert run.status == RunStatus.COMPLETED, run.error
    return run


@pytest.mark.django_db
def test_it_sends_anonymous_visitors_to_the_login_page(alice):
    session = make_session(alice, turns=1)
    client = Client()
    for url in ("/", page(session)):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    response = client.post(f"{page(session)}compact/", {"strategy": "trim"})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    login = client.get("/accounts/login/")
    assert login.status_code == 200
    assert b'<label for="id_username">' in login.content


@pytest.mark.django_db
def test_it_logs_in_to_the_sessions_list_and_logs_out_by_post(alice):
    client = Client()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/"
    listing = client.get("/")
    assert b'action="/accounts/logout/"' in listing.content
    assert client.post("/accounts/logout/").status_code in (200, 302)
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_it_shows_users_only_their_own_sessions_and_staff_all(alice, bob, staff):
    mine = make_session(alice, title="alice-work", turns=1)
    theirs = make_session(bob, title="bob-work", turns=1)
    listing = client_for(alice).get("/").content.decode()
    assert "alice-work" in listing and "bob-work" not in listing
    assert client_for(alice).get(page(theirs)).status_code == 404
    assert (
        client_for(alice)
        .post(f"{page(theirs)}events/{theirs.events.first().pk}/pin/", {"pinned": "1"})
        .status_code
        == 404
    )
    staff_listing = client_for(staff).get("/").content.decode()
    assert "alice-work" in staff_listing and "bob-work" in staff_listing
    assert client_for(staff).get(page(mine)).status_code == 200


@pytest.mark.django_db
def test_it_hides_staff_controls_from_users_and_refuses_their_forged_posts(alice):
    session = make_session(alice)
    run = compacted(session)
    client = client_for(alice)
    html = client.get(page(session)).content.decode()
    assert "Compact now" not in html and "Revert" not in html and 'id="controls"' not in html
    assert client.post(f"{page(session)}compact/preview/", {"strategy": "trim"}).status_code == 403
    assert client.post(f"{page(session)}compact/", {"strategy": "trim"}).status_code == 403
    assert client.post(f"{page(session)}compactions/{run.pk}/revert/").status_code == 403
    assert CompactionRun.objects.filter(session=session).count() == 1
    run.refresh_from_db()
    assert run.reverted_at is None


@pytest.mark.django_db
def test_it_requires_the_csrf_token_on_staff_posts(alice, staff):
    session = make_session(alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(f"{page(session)}compact/", {"strategy": "trim"}).status_code == 403
    assert not CompactionRun.objects.filter(session=session).exists()


@pytest.mark.django_db
def test_it_renders_event_content_as_text(alice, staff):
    session = make_session(alice, title=XSS, turns=1)
    event_append(session=session, events=[EventInput(type="USER_MESSAGE", content=XSS)])
    for client in (client_for(alice), client_for(staff)):
        html = client.get(page(session)).content.decode()
        assert "<script>alert(1)" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in html
        listing = client.get("/").content.decode()
        assert "<script>alert(1)" not in listing and "&lt;script&gt;" in listing


@pytest.mark.django_db
def test_it_previews_then_starts_a_compaction_as_staff(alice, staff):
    session = make_session(alice, limit=1500)
    client = client_for(staff)
    html = client.get(page(session)).content.decode()
    assert 'id="controls"' in html and "Compact now" in html
    preview = client.post(
        f"{page(session)}compact/preview/",
        {"strategy": "summarize"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="controls",
    )
    body = preview.content.decode()
    assert preview.status_code == 200 and body.lstrip().startswith('<section id="controls"')
    assert "<html" not in body and 'id="preview-fold"' in body and 'id="preview-after"' in body
    assert not CompactionRun.objects.filter(session=session).exists()  # a dry run changes nothing
    started = client.post(f"{page(session)}compact/", {"strategy": "summarize"})
    assert started.status_code == 302 and started["Location"] == page(session)
    run = CompactionRun.objects.get(session=session)
    assert (run.strategy, run.trigger, run.status, run.requested_by) == (
        "summarize",
        "manual",
        "pending",
        staff,
    )
    # A second request while one is pending is a conflict, shown as a notice.
    again = client.post(f"{page(session)}compact/", {"strategy": "trim"})
    assert again.status_code == 409 and "already pending or running" in again.content.decode()
    bad = client.post(f"{page(session)}compact/", {"strategy": "shred"})
    assert bad.status_code == 400


@pytest.mark.django_db
def test_it_shows_a_completed_compaction_and_reverts_it_as_staff(alice, staff):
    session = make_session(alice, limit=1500)
    before = session.context_tokens
    run = compacted(session)
    client = client_for(staff)
    html = client.get(page(session)).content.decode()
    assert f'id="run-{run.pk}"' in html and 'id="revert-btn"' in html
    assert f"{run.reduction_percent} %" in html
    assert "folded event" in html and "<details" in html  # folded events collapsed under it
    assert 'class="mark"' in html and "freed" in html  # the chart marks the compaction
    response = client.post(f"{page(session)}compactions/{run.pk}/revert/", HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and 'id="notice"' in body and "reverted" in body
    assert 'hx-swap-oob="true"' in body and 'id="gauge"' in body
    session.refresh_from_db()
    assert session.context_tokens == before
    # Only the latest completed, unreverted run can be reverted.
    again = client.post(f"{page(session)}compactions/{run.pk}/revert/")
    assert again.status_code == 409


@pytest.mark.django_db
def test_it_offers_revert_for_the_run_the_service_would_revert(alice, staff):
    session = make_session(alice, limit=1500)
    folding = compacted(session)
    # Each run folds most of the recent work the last one kept, until nothing is left to
    # fold: that later run completes without a COMPACTION event.
    no_op = compacted(session)
    for _ in range(10):
        if no_op.compaction_event_id is None:
            break
        folding, no_op = no_op, compacted(session)
    assert no_op.compaction_event_id is None and no_op.finished_at > folding.finished_at
    html = client_for(staff).get(page(session)).content.decode()
    assert f"compactions/{folding.pk}/revert/" in html
    assert f"compactions/{no_op.pk}/revert/" not in html
    response = client_for(staff).post(f"{page(session)}compactions/{folding.pk}/revert/")
    assert response.status_code == 302
    folding.refresh_from_db()
    assert folding.reverted_at is not None


@pytest.mark.django_db
def test_it_pins_and_unpins_an_event_for_the_owner(alice):
    session = make_session(alice, turns=1)
    event = Event.objects.get(session=session, seq=2)
    client = client_for(alice)
    response = client.post(
        f"{page(session)}events/{event.pk}/pin/", {"pinned": "1"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200 and 'id="timeline" class="card"' in response.content.decode()
    assert "Unpin event 2" in response.content.decode()
    event.refresh_from_db()
    assert event.pinned
    client.post(f"{page(session)}events/{event.pk}/pin/", {"pinned": "0"})
    event.refresh_from_db()
    assert not event.pinned


@pytest.mark.django_db
def test_it_colours_usage_bars_and_filters_sorts_and_pages_the_list(alice):
    low = make_session(alice, title="t-low", limit=100_000, turns=1)
    amber = make_session(alice, title="t-amber", limit=1000, turns=0)
    red = make_session(alice, title="t-red", turns=0, limit=1000)
    event_append(session=amber, events=[EventInput(type="USER_MESSAGE", content="word " * 800)])
    event_append(session=red, events=[EventInput(type="USER_MESSAGE", content="word " * 960)])
    make_session(alice, title="t-claude", model="claude-3.5-sonnet", turns=1)
    client = client_for(alice)
    html = client.get("/").content.decode()
    assert f'id="row-{low.pk}" class="level-ok"' in html
    assert f'id="row-{amber.pk}" class="level-warn"' in html
    assert f'id="row-{red.pk}" class="level-crit"' in html

    near = client.get("/?near=1").content.decode()
    assert "t-amber" in near and "t-red" in near and "t-low" not in near
    assert "t-claude" in client.get("/?model=claude-3.5-sonnet").content.decode()
    assert "t-low" not in client.get("/?model=claude-3.5-sonnet").content.decode()
    assert "t-claude" in client.get("/?q=T-CLAUDE").content.decode()
    by_usage = client.get("/?sort=-usage").content.decode()
    assert by_usage.index("t-red") < by_usage.index("t-amber") < by_usage.index("t-low")

    partial = client.get("/?q=t-amber", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="sessions-table")
    body = partial.content.decode()
    assert body.lstrip().startswith('<div id="sessions-table">') and "<html" not in body

    for number in range(30):
        make_session(alice, title=f"bulk {number}", turns=0)
    first = client.get("/").content.decode()
    assert "Page 1 of 2" in first and 'rel="next"' in first
    second = client.get("/?page=2").content.decode()
    assert "Page 2 of 2" in second and 'rel="prev"' in second
    assert client.get("/?page=999&sort=nonsense").status_code == 200


def _cookie_headers(user) -> list[tuple[bytes, bytes]]:
    client = client_for(user)
    client.get("/")  # sets the csrftoken cookie too
    cookies = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    return [(b"origin", b"http://testserver"), (b"cookie", cookies.encode())]


RUN_ID = "00000000-0000-0000-0000-000000000001"


def _pushed_frames(user, path: str, session, *messages) -> list[str]:
    """Open the dashboard socket `path` as `user` (cookie), broadcast each of `messages` on
    `session` and collect the HTML frame each one pushes."""
    headers = _cookie_headers(user)

    async def scenario() -> list[str]:
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        frames = []
        for message in messages:
            await sync_to_async(broadcast.broadcast)(
                session_id=session.pk, owner_id=session.owner_id, message=message
            )
            frames.append(await communicator.receive_from(timeout=10))
        await communicator.disconnect()
        return frames

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_it_pushes_html_fragments_to_the_session_page(alice, bob):
    session = make_session(alice)
    start, failed = _pushed_frames(
        alice,
        f"/ws/dashboard/sessions/{session.pk}/",
        session,
        realtime.CompactionStart(
            sessionId=str(session.pk),
            compactionId=RUN_ID,
            strategy="summarize",
            trigger="manual",
            message="Compacting conversation to reduce size…",
        ),
        realtime.CompactionComplete(
            sessionId=str(session.pk),
            compactionId=RUN_ID,
            success=False,
            tokensBefore=None,
            tokensAfter=None,
            eventsBefore=None,
            eventsAfter=None,
            reductionPercent=None,
            error=XSS,
            keptPercent=None,
            outcome="failed",
            message=f"Compaction failed: {XSS}",
        ),
    )
    assert (
        start.startswith('<div id="notice"') and "Compacting conversation to reduce size…" in start
    )
    assert 'id="gauge"' in start and 'id="history"' in start
    assert start.count('hx-swap-oob="true"') == 3
    assert "notice-error" in failed and "Compaction failed: &lt;script&gt;" in failed
    for part in ("gauge", "chart", "history", "summary", "timeline"):
        assert f'<section id="{part}"' in failed
    assert "<script>" not in failed


@pytest.mark.django_db(transaction=True)
def test_it_pushes_a_revert_notice_with_the_tokens_to_the_session_page(alice):
    session = make_session(alice)
    [frame] = _pushed_frames(
        alice,
        f"/ws/dashboard/sessions/{session.pk}/",
        session,
        realtime.compaction_reverted(
            session_id=session.pk, compaction_id=RUN_ID, tokens_before=1234, tokens_after=5678
        ),
    )
    assert frame.startswith('<div id="notice"') and "notice-success" in frame
    assert (
        "Compaction reverted: the folded events are active again (1,234 → 5,678 tokens)." in frame
    )
    assert 'id="gauge"' in frame and 'id="timeline"' in frame


@pytest.mark.django_db(transaction=True)
def test_it_pushes_the_row_to_the_sessions_list(alice):
    session = make_session(alice)
    [frame] = _pushed_frames(
        alice,
        "/ws/dashboard/sessions/",
        session,
        realtime.usage_updated(session),
    )
    assert frame.lstrip().startswith(f'<tr id="row-{session.pk}"') and 'hx-swap-oob="true"' in frame


@pytest.mark.django_db(transaction=True)
def test_it_refuses_dashboard_sockets_to_strangers(alice, bob):
    session = make_session(alice, turns=1)

    async def close_code(path, headers):
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect()
        assert connected  # accepted so the browser sees the close code
        output = await communicator.receive_output(timeout=5)
        await communicator.disconnect()
        return output.get("code")

    anonymous = [(b"origin", b"http://testserver")]
    assert async_to_sync(close_code)(f"/ws/dashboard/sessions/{session.pk}/", anonymous) == 4401
    assert async_to_sync(close_code)("/ws/dashboard/sessions/", anonymous) == 4401
    assert (
        async_to_sync(close_code)(f"/ws/dashboard/sessions/{session.pk}/", _cookie_headers(bob))
        == 4403
    )
