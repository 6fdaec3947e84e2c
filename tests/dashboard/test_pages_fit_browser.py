"""Pages as Chromium lays them out (issue 39): the admin's compaction-runs list fits a 1,400 px
window; the calls page's filters line up (its date fields styled like the others), and on a
phone each call's token figures say which is which; small costs never read "$0.0000"."""

from __future__ import annotations

import datetime

import pytest

from tests.dashboard.test_dashboard_browser import (
    SHOTS,
    _orm_beside_playwright,  # noqa: F401  (an autouse fixture)
    in_thread,
    log_in,
    new_page,
)


def _runs_and_calls(owner):
    from compaction_app.models import CompactionRun
    from sessions_app.calls import call_record
    from sessions_app.services import session_create

    session = session_create(
        owner=owner,
        model="gpt-4o",
        title="A session title long enough to take room in every list it appears in",
    )
    for index in range(6):
        CompactionRun.objects.create(
            session=session,
            strategy="summarize",
            trigger="manual",
            status="completed",
            tokens_before=11_319 + index,
            tokens_after=3_495,
            folded_count=21,
            thread="a-thread-key-of-sixteen" if index % 2 else "",
            error="",
        )
    now = datetime.datetime.now(datetime.UTC)
    call_record(
        session_id=session.pk,
        owner_id=owner.pk,
        started_at=now,
        wire="openai",
        status="ok",
        model_requested="gpt-4o-mini",
        prompt_tokens=727,
        completion_tokens=103,
    )
    return session


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser(username="root", password="pw-root")


def test_it_fits_the_admins_runs_list_in_1400_px(worker, root, live_url, browser):
    in_thread(_runs_and_calls, root)
    page, dialogs = new_page(browser, width=1400, height=900)
    log_in(page, live_url, "root")
    page.goto(f"{live_url}/admin/compaction_app/compactionrun/")
    table = page.locator("#result_list")
    table.wait_for()
    right = table.evaluate("t => t.getBoundingClientRect().right")
    assert right <= 1400, right
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    # Every column is on show, the last (the tokens) included.
    assert "11,319 → 3,495 (−69.1 %)" in page.locator("#result_list").inner_text()
    assert dialogs.alerts == []
    page.context.close()


@pytest.mark.parametrize("width,height", [(1400, 900), (390, 844)], ids=["desktop", "phone"])
def test_it_lines_up_the_calls_filters_and_names_the_token_figures(
    worker, alice, live_url, browser, width, height
):
    session = in_thread(_runs_and_calls, alice)
    page, dialogs = new_page(browser, width=width, height=height)
    log_in(page, live_url, "alice")
    page.goto(f"{live_url}/sessions/{session.pk}/calls/")
    since, model = page.locator("#c-since"), page.locator("#c-model")
    since.wait_for()
    look = "e => { const s = getComputedStyle(e); return [s.borderTopStyle, s.borderRadius, s.paddingTop, Math.round(e.getBoundingClientRect().height)]; }"
    assert since.evaluate(look) == model.evaluate(look)
    if width > 640:
        # The date fields, the other fields and the button: those on one row share a bottom.
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("form.filters").screenshot(path=str(SHOTS / f"calls-filters-{width}.png"))
        boxes = [
            page.locator(sel).evaluate("e => [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom]")
            for sel in (
                "#c-since", "#c-until", "#c-status", "#c-model", "#c-thread",
                "form.filters > button",
            )
        ]  # fmt: skip
        for top, bottom in boxes:
            for other_top, other_bottom in boxes:
                if abs(bottom - other_bottom) < 30:  # the same row
                    assert abs(bottom - other_bottom) <= 1, boxes
    cell = page.locator('#calls-table td[data-label^="Tokens"]').first
    label = cell.evaluate("e => getComputedStyle(e, '::before').content")
    text = cell.inner_text()
    assert "727 / 0 / 0 / 103" in text
    if width <= 640:
        # On a phone the header row is hidden: the cell's own label says what each figure is.
        assert "in / cached / write / out" in label, label
    cost = page.locator('#calls-table td[data-label="Cost"]').first.inner_text()
    assert cost.startswith("$0.0") and cost != "$0.0000", cost
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert dialogs.alerts == []
    page.context.close()
