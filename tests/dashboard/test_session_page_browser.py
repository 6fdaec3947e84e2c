"""The session page as people read it, in headless Chromium: the conversation trace, the
thresholds, one compaction's before / after, and the phone layout.

Uses the live server, browser and helpers of test_dashboard_browser (daphne in this process
with a real Celery worker thread). The pictures docs/dashboard.md shows come from
bench/screenshots.py.
"""

from __future__ import annotations

import pytest

from compaction_app.models import CompactionRun, RunStatus
from compaction_app.services import compaction_execute, compaction_request
from sessions_app.models import Session
from sessions_app.services import EventInput, TokenUsage, event_append, session_create
from tests.dashboard.test_dashboard_browser import (
    _orm_beside_playwright,  # noqa: F401  (an autouse fixture)
    in_thread,
    log_in,
    new_page,
    shot,
    wait_for_js,
    ws_ready,
)

LONG_RESULT = "\n".join(f"tests/test_module_{n}.py::test_case_{n} PASSED" for n in range(60))


def thirty_three_events(owner) -> Session:
    """System prompt + 8 turns of user, tool call, tool result, agent = 33 events, the size of
    the session the issue measured at 6,774 px."""
    session = session_create(
        owner=owner,
        model="gpt-4o",
        title="Fix the flaky payment tests",
        context_limit=100_000,
        system_prompt="You are a careful coding agent.",
        settings={"autoCompact": True, "keepRecentEvents": 2},
    )
    events = []
    for turn in range(8):
        events += [
            EventInput(type="USER_MESSAGE", content=f"Step {turn}: run the payment tests again."),
            EventInput(
                type="TOOL_CALL",
                name="run_tests",
                tool_call_id=f"call-{turn}",
                content='{"path": "tests/payments"}',
            ),
            EventInput(
                type="TOOL_RESULT",
                name="run_tests",
                tool_call_id=f"call-{turn}",
                content=f"{LONG_RESULT}\n== 1 failed, 59 passed in 3.{turn}s ==",
            ),
            EventInput(
                type="AGENT_MESSAGE",
                content=f"Turn {turn}: test_refund_{turn} still fails with KeyError 'currency'.",
                token_usage=TokenUsage(900 + turn, 40, 940 + turn),
            ),
        ]
    event_append(session=session, events=events)
    session.refresh_from_db()
    # At 88 % of the window, between the compact threshold and the hard limit.
    Session.objects.filter(pk=session.pk).update(context_limit=int(session.context_tokens / 0.88))
    session.refresh_from_db()
    return session


def compact(session: Session) -> CompactionRun:
    run = compaction_request(session=session, user=None, strategy="summarize", enqueue=False)
    return compaction_execute(run_id=run.pk)


def test_it_reads_as_a_trace_with_thresholds_and_a_runs_before_and_after(
    worker, alice, staff, live_url, browser
):
    session = in_thread(thirty_three_events, alice)
    run = in_thread(compact, session)
    assert run.status == RunStatus.COMPLETED and run.folded_count > 0
    page, dialogs = new_page(browser, width=1280, height=800)
    log_in(page, live_url, "staff")
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)

    # Readable labels, a tool call and its result as one span.
    trace = page.locator("#timeline")
    assert trace.locator(".entry-head .who", has_text="You").count() >= 1
    assert trace.locator(".entry-head .who", has_text="Agent").count() >= 1
    assert trace.locator(".entry-head .who", has_text="Tool: run_tests").count() >= 1
    spans = trace.locator("li.kind-tool")
    assert spans.count() == 8  # 8 calls, each with its result inside, none on its own
    assert trace.locator("li.type-tool_result").count() == 0
    # Reported usage and cost per turn.
    assert "reported: 907 prompt · 40 completion" in trace.inner_text()

    # Folded events stay in place: the group comes before the summary that folded them.
    group = trace.locator("li.fold-group").first
    label = group.locator("summary").first.inner_text()
    assert "folded into the summary" in label and "tokens" in label
    order = page.evaluate(
        """() => [...document.querySelectorAll('#timeline > ol.trace > li')]
                 .map(li => li.classList.contains('fold-group') ? 'fold' : li.className)"""
    )
    assert order.index("fold") < next(i for i, c in enumerate(order) if "kind-summary" in c)
    # Everything beyond the last few turns is collapsed, so the page stays short.
    shot(page, "session-trace-collapsed.png")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 2500, height
    # A fold is collapsed by default; opening it shows its events.
    assert not group.locator("li.entry").first.is_visible()
    group.locator("summary").first.click()
    assert group.locator("li.entry").first.is_visible()
    # An older, collapsed span opens on click and shows its call and result.
    older = spans.first
    assert not older.locator(".tool-part").first.is_visible()
    older.locator("summary.entry-head").click()
    assert older.locator(".tool-part").nth(1).is_visible()
    # Long content is clamped with "show all".
    more = older.locator("details.more > summary").first
    assert "show all" in more.inner_text()

    # Thresholds in sight: on the gauge, in the numbers, and as lines on the chart.
    assert page.locator("#gauge .gauge-tick").count() == 2
    assert "compact at 80 %" in page.locator("#thresholds").inner_text()
    assert "hard limit 95 %" in page.locator("#thresholds").inner_text()
    assert page.locator("#chart svg.chart-wide .threshold-line").count() == 2
    assert "cooldown" in page.locator("#auto-compaction").inner_text()

    # The history fits the page, the staff's Revert column included (no sideways scroll).
    assert page.evaluate(
        "(() => { const s = document.querySelector('#history .scroll');"
        " return s.scrollWidth <= s.clientWidth; })()"
    )
    # A run's before / after opens from the history.
    page.locator(f"#run-{run.pk} a.run-open").click()
    detail = page.locator("#run-detail")
    detail.locator(".before-after").wait_for()
    text = detail.inner_text()
    assert f"{run.tokens_before:,}" in text and f"{run.tokens_after:,}" in text
    assert "The summary it wrote" in text
    detail.locator("details.folded-list > summary").click()
    first_folded = detail.locator("details.folded-list li a").first
    target = first_folded.get_attribute("href")
    first_folded.click()
    # The link opens the fold that holds the event.
    page.locator(f"li{target}").wait_for(state="visible")
    shot(page, "session-trace.png")

    # The time axis, next to seq.
    page.locator("#axis-time").click()
    wait_for_js(
        page,
        "document.querySelector('#chart svg.chart-wide title').textContent.includes('by time')",
    )

    # Staff switch auto compaction off from the page.
    page.locator("#auto-toggle").click()
    wait_for_js(
        page, "document.getElementById('notice').textContent.includes('Auto compaction is off')"
    )
    session.refresh_from_db()
    assert session.settings["autoCompact"] is False
    assert dialogs.alerts == []
    page.context.close()


@pytest.mark.parametrize("width,height", [(390, 844)])
def test_it_fits_a_phone(worker, alice, live_url, browser, width, height):
    session = in_thread(thirty_three_events, alice)
    in_thread(compact, session)
    page, _ = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    # The gauge card is one column: the numbers sit below the ring, not beside it.
    ring = page.locator("#gauge .gauge-ring").bounding_box()
    numbers = page.locator("#gauge dl.numbers").bounding_box()
    assert numbers["y"] >= ring["y"] + ring["height"] - 1
    # The chart drawn for phones: fewer ticks, text at a legible size.
    assert not page.locator("svg.chart-wide").is_visible()
    narrow = page.locator("svg.chart-narrow")
    assert narrow.is_visible()
    assert narrow.locator("text.axis").count() <= 10
    font = page.evaluate(
        """() => {
            const svg = document.querySelector('svg.chart-narrow');
            const text = svg.querySelector('text.axis');
            const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
            return parseFloat(getComputedStyle(text).fontSize) * scale;
        }"""
    )
    assert font >= 10, font
    # No staff controls for a user, even on a phone.
    assert page.locator("#auto-toggle").count() == 0
    shot(page, "session-trace-phone.png")
    page.context.close()


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_it_keeps_a_60_turn_summarized_session_within_two_screens(
    worker, alice, live_url, browser, width, height
):
    """Issue 25: one row for the folded stretch, the latest window only, and on a phone a
    search box whose placeholder fits and no empty "Error" labels."""
    from tests.support.long_session import summarized_session

    session = in_thread(summarized_session, alice, turns=60, title="Sixty summarized turns")
    page, dialogs = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    timeline = page.locator("#timeline").bounding_box()
    name = f"session-60-turns-{width}.png"
    shot(page, name)
    assert timeline["height"] <= 2 * height, (timeline["height"], name)
    assert page.locator("#timeline li.fold-run").count() == 1
    total = page.evaluate("document.documentElement.scrollHeight")
    assert total <= 5 * height, total
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    # The whole placeholder shows.
    cut = page.evaluate(
        """() => {
            const input = document.getElementById('event-search');
            const style = getComputedStyle(input);
            const ctx = document.createElement('canvas').getContext('2d');
            ctx.font = style.font;
            const room = input.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight);
            return ctx.measureText(input.placeholder).width > room;
        }"""
    )
    assert not cut
    # No label without a value (the history's error column of runs that did not fail).
    empty_labels = page.evaluate(
        """() => [...document.querySelectorAll('table.history td')]
                 .filter(td => td.offsetParent !== null && td.textContent.trim() === ''
                         && getComputedStyle(td, '::before').content.includes('Error'))
                 .length"""
    )
    assert empty_labels == 0
    # "Earlier" loads the previous window in place.
    earlier = page.locator("#timeline li.earlier a")
    assert earlier.count() == 1
    before = page.locator("#timeline li.entry, #timeline li.fold-group").count()
    earlier.click()
    wait_for_js(
        page,
        f"document.querySelectorAll('#timeline li.entry, #timeline li.fold-group').length > {before}",
    )
    assert dialogs.alerts == []
    page.context.close()


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_it_shows_a_new_user_how_to_start(worker, alice, live_url, browser, width, height):
    from rest_framework.authtoken.models import Token

    token = in_thread(lambda: Token.objects.get_or_create(user=alice)[0].key)
    page, dialogs = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    panel = page.locator("#get-started")
    assert panel.is_visible()
    assert f"{live_url}/gateway/openai/v1" in panel.inner_text()
    # Every wire has its base URL there: Gemini's (SDK and CLI) too.
    assert f"{live_url}/gateway/anthropic" in panel.inner_text()
    assert (
        f'"base_url": "{live_url}/gateway/gemini"' in page.locator("#gemini-base-url").inner_text()
    )
    assert f"GOOGLE_GEMINI_BASE_URL={live_url}/gateway/gemini" in panel.inner_text()
    # The token is shown as it is (no "show" to click before a curl line that prints it).
    assert page.locator("#api-token").is_visible()
    assert page.locator("#api-token").inner_text() == token
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    shot(page, f"get-started-{width}.png")
    page.get_by_role("link", name="Get started").click()
    page.wait_for_url(f"{live_url}/get-started/")
    assert page.locator("#get-started").is_visible()
    assert dialogs.alerts == []
    page.context.close()


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
def test_it_puts_the_conversation_before_the_secondary_panels(
    worker, alice, live_url, browser, width, height
):
    """Main content first: the gauge's main figures, the chart, then the conversation; the
    history, the MCP snippets and the less-read figures after it or folded."""
    session = in_thread(thirty_three_events, alice)
    in_thread(compact, session)
    page, dialogs = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    page.goto(f"{live_url}/sessions/{session.pk}/")
    ws_ready(page)
    tops = page.evaluate(
        """() => Object.fromEntries(['gauge', 'chart', 'summary', 'timeline', 'history',
                 'connect-agents'].map(id => [id, document.getElementById(id)
                 .getBoundingClientRect().top + window.scrollY]))"""
    )
    order = sorted(tops, key=tops.get)
    assert order == ["gauge", "chart", "summary", "timeline", "history", "connect-agents"], tops
    # Folded until asked for: the less-read figures and the snippets.
    assert not page.locator("#gauge details.more-figures").get_attribute("open")
    assert not page.locator("#gauge #active-events").is_visible()
    assert page.locator("#gauge #cost").is_visible()
    assert not page.locator("#connect-agents pre").first.is_visible()
    page.locator("#gauge details.more-figures > summary").click()
    assert page.locator("#gauge #active-events").is_visible()
    # On a wide screen without the staff controls the gauge takes the whole row.
    if width >= 900:
        gauge = page.locator("#gauge").bounding_box()
        chart = page.locator("#chart").bounding_box()
        assert abs(gauge["width"] - chart["width"]) < 2, (gauge, chart)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert dialogs.alerts == []
    page.context.close()


def test_it_shows_an_empty_list_the_way_in_not_its_filters(worker, alice, live_url, browser):
    page, dialogs = new_page(browser, width=390, height=844)
    log_in(page, live_url, "alice")
    assert page.locator("#get-started").is_visible()
    assert page.locator("form.filters").count() == 0
    # The panel starts within the first screen.
    assert page.locator("#get-started").bounding_box()["y"] < 844 / 2
    assert dialogs.alerts == []
    page.context.close()
